//! The README's walkthroughs, run as written. The five-minute walkthrough: `brokkr serve` with
//! the built-in configuration in the background (the built binary instead of `cargo run
//! --release`, its store in a test directory), then the user-provided flow and the local
//! PostgreSQL flow (provision, bind, `psql` with the binding's URI, unbind, deprovision). The
//! shared-servers section, against the local PostgreSQL, MariaDB and Redis: its first block
//! (admin accounts, then `brokkr serve`) in the background, its second (provision, bind, unbind,
//! deprovision with `brokkr osb`) to the end. Only the port is changed to a free one. On a
//! machine without `sudo` (a root container), a stand-in on the PATH runs the command as the
//! user `-u` names, with `runuser`.

mod support;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{BIN, free_port};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `sh` blocks of the README section that starts with `heading`, in order.
fn sh_blocks(heading: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split_once(heading)
        .expect("the section")
        .1
        .split("\n## ")
        .next()
        .unwrap()
        .split("\n### ")
        .next()
        .unwrap();
    section
        .split("```sh\n")
        .skip(1)
        .map(|block| block.split("```").next().unwrap().to_owned())
        .collect()
}

/// A PATH with `brokkr`, and `sudo` when the machine has none.
fn path(dir: &Path) -> String {
    let bin = Path::new(BIN).parent().unwrap();
    let mut path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let has_sudo = Command::new("sh")
        .args(["-c", "command -v sudo"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_sudo {
        let shim = dir.join("sudo");
        std::fs::write(
            &shim,
            "#!/bin/sh\nif [ \"$1\" = -u ]; then user=$2; shift 2; exec runuser -u \"$user\" -- \"$@\"; fi\nexec \"$@\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        path = format!("{}:{path}", dir.display());
    }
    path
}

/// Runs `script` in bash from the repository's root.
fn bash(script: &str, path: &str, dir: &Path) -> Command {
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .current_dir(root())
        .env("PATH", path)
        .env("HOME", dir)
        .env_remove("BROKKR_CONFIG")
        .env_remove("BROKKR_STORE");
    command
}

/// Removes the README's admin accounts (and, in PostgreSQL, hands what a failed run left owned by
/// it to `postgres`), so that the section runs on a machine where it ran before.
fn forget_admin_accounts(path: &str, dir: &Path) {
    let out = bash(
        "sudo -u postgres psql -q -v ON_ERROR_STOP=1 -c \"DO \\$\\$ BEGIN
           IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'brokkr_admin') THEN
             REASSIGN OWNED BY brokkr_admin TO postgres; DROP OWNED BY brokkr_admin;
             DROP ROLE brokkr_admin;
           END IF; END \\$\\$\" >/dev/null
         sudo mariadb -e \"DROP USER IF EXISTS 'brokkr_admin'@'%'\"
         redis-cli ACL DELUSER brokkr_admin >/dev/null",
        path,
        dir,
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The process group of the README's first block (the broker), stopped when dropped.
struct Group(std::process::Child);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.wait();
    }
}

/// Starts `serve` (a script) in the background with its output in `log`, and waits until it
/// listens on `port`.
fn start_broker(serve: &str, path: &str, dir: &Path, port: &str, log: &Path) -> Group {
    let broker = Group(
        bash(serve, path, dir)
            .env("BROKKR_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port.parse::<u16>().unwrap())).is_err() {
        assert!(
            Instant::now() < deadline,
            "the broker did not start: {}",
            std::fs::read_to_string(log).unwrap()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    broker
}

#[test]
fn the_five_minute_walkthrough_runs_as_written() {
    let blocks = sh_blocks("## Five-minute walkthrough");
    assert_eq!(blocks.len(), 3, "three sh blocks: {blocks:#?}");
    let port = free_port().to_string();
    let serve = &blocks[0];
    assert!(
        serve.contains("cargo run --release -p brokkr -- serve"),
        "{serve}"
    );
    let serve = serve.replace("cargo run --release -p brokkr -- serve", "brokkr serve");
    let flow = format!("{}\n{}", blocks[1], blocks[2]).replace("8080", &port);
    let dir = tempfile::tempdir().unwrap();
    // The local servers run as an unprivileged account when the tests run as root: it must
    // pass through the test directory to reach their data below the store.
    let open = std::os::unix::fs::PermissionsExt::from_mode(0o711);
    std::fs::set_permissions(dir.path(), open).unwrap();
    let path = path(dir.path());
    let store = format!("sqlite://{}", dir.path().join("brokkr.db").display());
    let log = dir.path().join("broker.log");
    let broker = start_broker(
        &format!("export BROKKR_STORE={store}\n{serve}"),
        &path,
        dir.path(),
        &port,
        &log,
    );

    let out = bash(&flow, &path, dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\nbroker: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&log).unwrap()
    );
    assert!(stdout.contains("s3cret"), "{stdout}");
    assert!(
        stdout.contains("PostgreSQL 1"),
        "psql did not answer: {stdout}"
    );
    drop(broker);
    let servers = std::fs::read_dir(dir.path().join("brokkr.db.d"))
        .unwrap()
        .count();
    assert_eq!(servers, 0, "deprovision left a server directory");
}

#[test]
fn the_shared_servers_section_runs_as_written() {
    let blocks = sh_blocks("### Shared database servers");
    assert_eq!(blocks.len(), 2, "two sh blocks: {blocks:#?}");
    let port = free_port().to_string();
    let [serve, flow] = [&blocks[0], &blocks[1]].map(|b| b.replace("8080", &port));
    let dir = tempfile::tempdir().unwrap();
    let path = path(dir.path());
    forget_admin_accounts(&path, dir.path());

    let store = dir.path().join("shared.db");
    let serve = serve.replace(
        "sqlite://shared.db",
        &format!("sqlite://{}", store.display()),
    );
    let log = tempfile::NamedTempFile::new().unwrap();
    let broker = start_broker(&serve, &path, dir.path(), &port, log.path());

    let out = bash(&flow, &path, dir.path()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\nbroker: {}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(log.path()).unwrap()
    );
    assert!(stdout.contains("\"type\": \"postgresql\""), "{stdout}");
    assert!(stdout.contains("postgresql://"), "{stdout}");
    drop(broker);
    forget_admin_accounts(&path, dir.path());
}
