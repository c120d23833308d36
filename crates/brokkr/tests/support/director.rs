//! A local server playing the Kyma Director, and a configuration whose plan learns an
//! instance's dashboard URL from it: `GET /runtimes/ID/status` answers `{"status": "in
//! progress"}` (with `Retry-After: 0`) the first two times it is asked about a runtime, then
//! `{"status": "finished", "dashboardURL": "https://console.example.com/runtimes/ID"}`.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

/// The Director, serving on a thread of its own for as long as the test runs.
pub struct Director {
    /// Its base URL.
    pub url: String,
    /// How many times each runtime's status was asked for.
    calls: Arc<Mutex<HashMap<String, usize>>>,
}

impl Director {
    /// Starts it on a loopback port.
    pub fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the Director's port");
        let url = format!("http://{}", listener.local_addr().expect("its address"));
        let calls = Arc::new(Mutex::new(HashMap::new()));
        let seen = calls.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let _ = answer(stream, &seen);
            }
        });
        Self { url, calls }
    }

    /// How many times runtime `id`'s status was asked for.
    pub fn calls(&self, id: &str) -> usize {
        self.calls.lock().unwrap().get(id).copied().unwrap_or(0)
    }

    /// The dashboard URL it gives runtime `id` once finished.
    pub fn dashboard(id: &str) -> String {
        format!("https://console.example.com/runtimes/{id}")
    }

    /// A configuration with service `kyma` (instances retrievable), whose plan `runtime` learns
    /// the instance's dashboard URL from this Director, and whose plan `grafana` has a fixed
    /// pattern.
    pub fn config(&self) -> String {
        format!(
            r#"
catalog:
  services:
  - name: kyma
    id: svc-kyma
    description: A runtime whose console the Director knows
    bindable: false
    instances_retrievable: true
    plans:
    - {{name: runtime, id: plan-runtime, description: The console is known once provisioned}}
    - {{name: grafana, id: plan-grafana, description: A fixed dashboard per instance}}
blueprints:
- service: kyma
  plan: runtime
  instance:
    steps:
    - name: director
      run: http
      with:
        url: "{}/runtimes/{{{{ instance_id }}}}/status"
        until: {{pointer: /status, equals: finished}}
        extract: {{console: /dashboardURL}}
      outputs: [console]
    dashboard_url: "{{{{ registry('console') }}}}"
- service: kyma
  plan: grafana
  instance:
    steps:
    - {{name: settle, delay: 100ms}}
    dashboard_url: "https://grafana.example.com/d/{{{{ instance_id }}}}"
"#,
            self.url
        )
    }
}

/// Answers one request on `stream`.
fn answer(
    stream: std::net::TcpStream,
    calls: &Mutex<HashMap<String, usize>>,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut request_line = String::new();
    reader.read_line(&mut request_line)?;
    loop {
        let mut header = String::new();
        if reader.read_line(&mut header)? == 0 || header == "\r\n" {
            break;
        }
    }
    let path = request_line.split(' ').nth(1).unwrap_or_default();
    let id = path
        .strip_prefix("/runtimes/")
        .and_then(|rest| rest.strip_suffix("/status"));
    let (status, extra, body) = match id {
        None => ("404 Not Found", "", String::new()),
        Some(id) => {
            let mut calls = calls.lock().unwrap();
            let asked = calls.entry(id.to_owned()).or_default();
            *asked += 1;
            if *asked <= 2 {
                let body = r#"{"status": "in progress"}"#.to_owned();
                ("200 OK", "Retry-After: 0\r\n", body)
            } else {
                let body = serde_json::json!({"status": "finished",
                                              "dashboardURL": Director::dashboard(id)});
                ("200 OK", "", body.to_string())
            }
        }
    };
    let mut stream = stream;
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         {extra}Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    stream.flush()
}
