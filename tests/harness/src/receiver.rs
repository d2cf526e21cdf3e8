//! A webhook receiver for tests of deliveries out (Standard Webhooks, A2A push
//! notifications): Python's `http.server`, logging every request, answering by path.

use std::path::PathBuf;
use std::time::Duration;

/// The services' Python (where `standardwebhooks` is installed).
pub fn services_python() -> PathBuf {
    let state = std::env::var("TURNPIKE_SERVICES_DIR")
        .unwrap_or_else(|_| "/var/tmp/turnpike-services".into());
    PathBuf::from(state).join("venv/bin/python")
}

const LONG: Duration = Duration::from_secs(120);

/// A webhook receiver (Python's `http.server`) that logs every request it gets — path, headers,
/// body — one JSON line each, and answers by path: `/flaky/…` fails each message's first three
/// attempts (500), `/hang/…` answers nothing while the file `hang` exists beside the log,
/// `/redirect/…` redirects to `/ok/redirected` (on 127.0.0.1), anything else answers 200.
const RECEIVER: &str = r#"
import http.server, json, os, sys, threading, time
port_file, log_file = sys.argv[1:3]
hang_file = os.path.join(os.path.dirname(log_file), "hang")
lock = threading.Lock()
seen = {}
class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0"))).decode()
        headers = {k.lower(): v for k, v in self.headers.items()}
        key = (self.path, headers.get("webhook-id"))
        with lock:
            seen[key] = seen.get(key, 0) + 1
            attempt = seen[key]
        status = 200
        if self.path.startswith("/flaky/") and attempt <= 3:
            status = 500
        elif self.path.startswith("/hang/"):
            while os.path.exists(hang_file):
                time.sleep(0.05)
            status = 200
        elif self.path.startswith("/redirect/"):
            status = 302
        with lock:
            with open(log_file, "a") as f:
                f.write(json.dumps({"path": self.path, "headers": headers, "body": body, "status": status}) + "\n")
        self.send_response(status)
        if status == 302:
            self.send_header("location", "http://127.0.0.1:%d/ok/redirected" % self.server.server_port)
        self.send_header("content-length", "0")
        self.end_headers()
server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
with open(port_file + ".tmp", "w") as f:
    f.write(str(server.server_port))
os.rename(port_file + ".tmp", port_file)
server.serve_forever()
"#;

/// A running receiver (the script above), killed when dropped.
pub struct Receiver {
    child: std::process::Child,
    dir: tempfile::TempDir,
    pub port: u16,
}

impl Receiver {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("receiver.py");
        std::fs::write(&script, RECEIVER).unwrap();
        let port_file = dir.path().join("port");
        let child = std::process::Command::new(services_python())
            .arg(&script)
            .arg(&port_file)
            .arg(dir.path().join("log.jsonl"))
            .spawn()
            .expect("the services' python");
        let port = crate::wait::until(LONG, "the receiver's port", || async {
            std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.parse().ok())
        })
        .await;
        Self { child, dir, port }
    }

    /// Every request so far, in order.
    pub fn log(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.path().join("log.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    pub fn on(&self, path: &str) -> Vec<serde_json::Value> {
        self.log()
            .into_iter()
            .filter(|r| r["path"] == path)
            .collect()
    }

    pub fn hang(&self, on: bool) {
        let flag = self.dir.path().join("hang");
        if on {
            std::fs::write(flag, "").unwrap();
        } else {
            let _ = std::fs::remove_file(flag);
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.hang(false);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the Standard Webhooks reference library (`standardwebhooks` from PyPI) verifies the
/// logged request `request` with `secret` (its timestamp checked against now).
pub fn verifies(secret: &str, request: &serde_json::Value) -> bool {
    let script = "import sys, json\n\
                  from standardwebhooks.webhooks import Webhook\n\
                  secret, headers, body = sys.argv[1:4]\n\
                  Webhook(secret).verify(body, json.loads(headers))\n";
    std::process::Command::new(services_python())
        .args([
            "-c",
            script,
            secret,
            &request["headers"].to_string(),
            request["body"].as_str().unwrap(),
        ])
        .output()
        .expect("the services' python")
        .status
        .success()
}
