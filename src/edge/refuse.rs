//! Connections over a cap: a short `503` with a JSON body and
//! `Connection: close`, never a silent hold, and bounded in what it costs.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWrite;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;

/// At most this many over-the-cap connections per listener are being sent
/// their `503` at once (each for at most about 2.5 seconds); beyond that the
/// `503` is written without waiting (best effort) and the connection closed
/// at once. This bounds the descriptors refusals can hold.
pub const REFUSAL_SLOTS: usize = 32;

/// How long a refused connection may take to begin its request before the
/// `503` goes out anyway. Answering before the request has begun is an
/// "unsolicited response" that HTTP clients (hyper, Go's net/http) report as
/// an error instead of the `503`; a client sends its request at once, so
/// waiting for its first bytes costs a few milliseconds.
const REFUSAL_WAIT_FOR_REQUEST: Duration = Duration::from_millis(250);
/// How long writing the `503` refusal may take.
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// After the refusal is written, how long to wait for the client to close
/// (reading and discarding what it sent), so that closing our side does not
/// turn into a reset that would destroy the `503` before the client read it.
const REFUSAL_LINGER: Duration = Duration::from_secs(1);

pub(super) fn error_json(code: &str, message: &str) -> String {
    // `code` and `message` are fixed strings of ours without quotes or
    // backslashes, so no escaping is needed.
    format!(r#"{{"error":{{"code":"{code}","message":"{message}"}}}}"#)
}

pub(super) fn overloaded_response(message: &str) -> Vec<u8> {
    let body = error_json("overloaded", message);
    format!(
        "HTTP/1.1 503 Service Unavailable\r\n\
         content-type: application/json\r\n\
         content-length: {}\r\n\
         connection: close\r\n\
         retry-after: 1\r\n\
         \r\n\
         {body}",
        body.len()
    )
    .into_bytes()
}

/// Sends the `503` to a connection over the cap, once its request has begun,
/// and closes it, bounded to about [`REFUSAL_WAIT_FOR_REQUEST`] +
/// [`REFUSAL_WRITE_TIMEOUT`] + [`REFUSAL_LINGER`].
pub(super) async fn refuse(
    mut stream: TcpStream,
    response: Arc<[u8]>,
    _slot: OwnedSemaphorePermit,
) {
    let _ = tokio::time::timeout(REFUSAL_WAIT_FOR_REQUEST, request_begun(&stream)).await;
    let written = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write_all(&stream, &response)).await;
    if !matches!(written, Ok(Ok(()))) {
        return;
    }
    // FIN after the response, then read and discard until the client closes:
    // closing with unread request bytes in our receive buffer would send a
    // reset, and a reset can make the client drop the 503 unread.
    let _ = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx)).await;
    let _ = tokio::time::timeout(REFUSAL_LINGER, async {
        let mut buf = [0u8; 1024];
        let mut total = 0usize;
        while total < 64 * 1024 {
            if stream.readable().await.is_err() {
                break;
            }
            match stream.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
        }
    })
    .await;
}

/// The refusal without a task, for bursts: discard what the client already
/// sent, write the `503` if the socket takes it at once (a new socket's send
/// buffer is empty, so it does), send FIN, discard again, close. A request
/// arriving after the last discard can still turn the close into a reset,
/// and a `503` written before the request has begun is an error to some
/// clients (see [`REFUSAL_WAIT_FOR_REQUEST`]); that is the price of holding
/// nothing.
pub(super) fn refuse_now(stream: TcpStream, response: &[u8]) {
    let Ok(stream) = stream.into_std() else {
        return;
    };
    // Still non-blocking: reads and writes return WouldBlock, never wait.
    let discard = |mut s: &std::net::TcpStream| {
        let mut buf = [0u8; 1024];
        for _ in 0..64 {
            match io::Read::read(&mut s, &mut buf) {
                Ok(n) if n > 0 => {}
                _ => break,
            }
        }
    };
    discard(&stream);
    if !matches!(io::Write::write(&mut &stream, response), Ok(n) if n == response.len()) {
        return;
    }
    let _ = stream.shutdown(std::net::Shutdown::Write);
    discard(&stream);
}

/// Waits until the client has sent something (or closed, or failed), and
/// drops what it sent so far. `readable` may report readiness that is not
/// there (a new socket often does), hence the loop.
async fn request_begun(stream: &TcpStream) {
    let mut buf = [0u8; 1024];
    let mut total = 0usize;
    loop {
        if stream.readable().await.is_err() {
            return;
        }
        match stream.try_read(&mut buf) {
            Ok(n) if n > 0 && total < 64 * 1024 => total += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && total == 0 => {}
            _ => return,
        }
    }
}

/// `write_all` without tokio's `io-util` feature.
async fn write_all(stream: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        stream.writable().await?;
        match stream.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overloaded_response_is_well_formed() {
        let r = String::from_utf8(overloaded_response("retry later")).unwrap();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 503 "));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(head.contains("connection: close"));
        assert_eq!(
            body,
            r#"{"error":{"code":"overloaded","message":"retry later"}}"#
        );
    }
}
