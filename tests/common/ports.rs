//! Free ports on loopback, for a server that binds its own address (a
//! child process, an exporter, Prometheus, chromedriver).

use std::net::SocketAddr;

/// A port nothing listens on right now (the listener that found it is
/// closed again).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `127.0.0.1:<a free port>`.
pub fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], free_port()))
}
