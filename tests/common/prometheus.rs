//! Prometheus in the tests: the text format `/metrics` answers in
//! ([`Scrape`]), and a real Prometheus and promtool, from Debian's package
//! that `scripts/test-deps.sh` unpacks into target/tools ([`Prometheus`],
//! [`check_rules`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::ports::free_port;
use super::servers::json_of;

/// How long Prometheus may take to start.
const STARTUP: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------
// The Prometheus text format

/// One scrape of /metrics, parsed.
pub struct Scrape {
    pub text: String,
    pub samples: Vec<Sample>,
    /// Metric family name -> type, from `# TYPE` lines.
    pub families: BTreeMap<String, String>,
    /// Metric family name -> help text, from `# HELP` lines.
    pub helps: BTreeMap<String, String>,
}

#[derive(Debug)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Scrape {
    pub async fn fetch(addr: SocketAddr) -> Scrape {
        let text = reqwest::get(format!("http://{addr}/metrics"))
            .await
            .expect("scrape /metrics")
            .error_for_status()
            .unwrap()
            .text()
            .await
            .unwrap();
        Scrape::parse(text)
    }

    pub fn parse(text: String) -> Scrape {
        let mut samples = Vec::new();
        let mut families = BTreeMap::new();
        let mut helps = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                helps.insert(name.to_string(), help.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
                families.insert(name.to_string(), kind.to_string());
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                samples.push(parse_sample(line).unwrap_or_else(|| panic!("cannot parse {line:?}")));
            }
        }
        Scrape {
            text,
            samples,
            families,
            helps,
        }
    }

    /// Sample names and family names.
    pub fn names(&self) -> BTreeSet<String> {
        self.samples
            .iter()
            .map(|s| s.name.clone())
            .chain(self.families.keys().cloned())
            .collect()
    }

    pub fn matching<'a>(
        &'a self,
        name: &'a str,
        labels: &'a [(&str, &str)],
    ) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
    }

    /// The sum of the samples of `name` that carry `labels` (0 if none).
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.matching(name, labels).map(|s| s.value).sum()
    }

    /// The one sample of `name` with `labels` has `value`.
    pub fn expect(&self, name: &str, labels: &[(&str, &str)], value: f64) -> Result<(), String> {
        let found: Vec<&Sample> = self.matching(name, labels).collect();
        match found.as_slice() {
            [one] if one.value == value => Ok(()),
            [one] => Err(format!("{name}{labels:?} is {}, not {value}", one.value)),
            [] => Err(format!("{name}{labels:?} is missing")),
            many => Err(format!("{name}{labels:?} matches {} series", many.len())),
        }
    }
}

/// `name{label="value",...} value`, with the format's escapes in values.
pub fn parse_sample(line: &str) -> Option<Sample> {
    let name_end = line.find(['{', ' '])?;
    let name = line[..name_end].to_string();
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(mut inner) = rest.strip_prefix('{') {
        loop {
            inner = inner.trim_start_matches(',');
            if let Some(after) = inner.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, quoted) = inner.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = quoted.char_indices();
            let end = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => match chars.next()?.1 {
                        'n' => value.push('\n'),
                        escaped => value.push(escaped),
                    },
                    (_, c) => value.push(c),
                }
            };
            labels.insert(key.to_string(), value);
            inner = &quoted[end + 1..];
        }
    }
    let value = match rest.split_whitespace().next()? {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        other => other.parse().ok()?,
    };
    Some(Sample {
        name,
        labels,
        value,
    })
}

// ---------------------------------------------------------------------------
// A real Prometheus and promtool

/// `promtool check rules` passes on `rules`.
pub fn check_rules(rules: &str) {
    let promtool = tool("promtool");
    let out = Command::new(promtool)
        .args(["check", "rules", rules])
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "promtool check rules {rules}:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The path of a Prometheus tool; installs the package when it is missing
/// (the same script `make test` runs), and fails saying why if it cannot.
pub fn tool(name: &str) -> PathBuf {
    let find = || {
        // scripts/test-deps.sh unpacks Debian's package into target/tools.
        std::iter::once(PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/tools/bin"
        )))
        .chain(
            std::env::var_os("PATH")
                .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .unwrap_or_default(),
        )
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
    };
    if let Some(path) = find() {
        return path;
    }
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/test-deps.sh");
    let out = Command::new(script).output();
    find().unwrap_or_else(|| {
        let why = match out {
            Ok(out) => String::from_utf8_lossy(&out.stderr).into_owned(),
            Err(e) => format!("cannot run {script}: {e}"),
        };
        panic!(
            "{name} is not installed and could not be installed: {why}\n\
             The metrics checks need Debian's `prometheus` package (apt-get install prometheus)."
        )
    })
}

/// A throwaway Prometheus scraping one target every second, with the alert
/// rules loaded; killed when dropped.
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    base: String,
    http: reqwest::Client,
}

impl Prometheus {
    pub async fn start(target: SocketAddr, rules: &Path) -> Prometheus {
        let binary = tool("prometheus");
        let dir = std::env::temp_dir().join(format!(
            "watchpump-prometheus-{:016x}",
            rand::random::<u64>()
        ));
        std::fs::create_dir_all(dir.join("data")).unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {rules}\n\
             scrape_configs:\n  - job_name: watchpump\n    static_configs:\n      - targets: ['{target}']\n",
            rules = rules.display()
        );
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let port = free_port();
        let child = Command::new(binary)
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start prometheus");
        let prometheus = Prometheus {
            child,
            dir,
            base: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        let started = Instant::now();
        loop {
            let ready = prometheus
                .http
                .get(format!("{}/-/ready", prometheus.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return prometheus;
            }
            assert!(
                started.elapsed() < STARTUP,
                "prometheus did not become ready:\n{}",
                prometheus.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// An instant query: the result vector, or Prometheus' error.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let answer: Value = self
            .http
            .get(format!("{}/api/v1/query", self.base))
            .query(&[("query", expr)])
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        if answer["status"] != "success" {
            return Err(format!("{}: {}", answer["errorType"], answer["error"]));
        }
        Ok(match &answer["data"]["result"] {
            Value::Array(series) => series.clone(),
            scalar => vec![scalar.clone()],
        })
    }

    pub async fn get(&self, path: &str) -> Value {
        let answer = json_of(self.http.get(format!("{}{path}", self.base))).await;
        assert_eq!(answer["status"], "success", "{path}: {answer}");
        answer
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- prometheus log ---\n{}", self.log());
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
