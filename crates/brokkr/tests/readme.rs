//! The README's walkthroughs, run as written. The set-up and five-minute walkthrough sections
//! (with the local servers), every `sh` block as printed, in a copy of the repository's root with
//! the default store, the relative `sqlite://brokkr.db`: `cargo run --release -p brokkr -- serve`
//! runs the `brokkr` the tests built (a `cargo` stand-in on the PATH), in the background; the
//! user-provided flow and the local PostgreSQL flow (provision, bind, `psql` with the binding's
//! URI, unbind, deprovision) then print what the README shows. The shared-servers section, against
//! the local PostgreSQL, MariaDB and Redis: its first block (admin accounts, then `brokkr serve`)
//! in the background, its second (provision, bind, unbind, deprovision with `brokkr osb`) to the
//! end. Only the port is changed to a free one. On a machine without `sudo` (a root container), a
//! stand-in on the PATH runs the command as the user `-u` names, with `runuser`.

mod support;

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
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
    start_broker_in(bash(serve, path, dir), port, log)
}

/// Starts `serve` (a script's command) in the background with its output in `log`, and waits
/// until it listens on `port`.
fn start_broker_in(mut serve: Command, port: &str, log: &Path) -> Group {
    let output = std::fs::File::create(log).unwrap();
    let broker = Group(
        serve
            .env("BROKKR_LISTEN", format!("127.0.0.1:{port}"))
            .stdout(output.try_clone().unwrap())
            .stderr(output)
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

/// A copy of the repository's root (without `target/`, `.git` and stores a run left there), for
/// the README's commands to run in as a user's checkout, and a `cargo` on the PATH that runs
/// `cargo run --release -p brokkr -- ARGS` as the `brokkr` the tests built (so that no release
/// build runs in the test).
fn checkout(dir: &Path) -> (PathBuf, String) {
    let copy = dir.join("brokkr");
    std::fs::create_dir(&copy).unwrap();
    let status = Command::new("sh")
        .arg("-c")
        .arg(
            "tar -C \"$1\" --exclude=./target --exclude=./.git --exclude='./brokkr.db*' \
               --exclude='./shared.db*' -cf - . | tar -C \"$2\" -xf -",
        )
        .args([
            "tar",
            &root().display().to_string(),
            &copy.display().to_string(),
        ])
        .status()
        .unwrap();
    assert!(status.success(), "cannot copy the repository");
    let shims = dir.join("shims");
    std::fs::create_dir(&shims).unwrap();
    let cargo = shims.join("cargo");
    std::fs::write(
        &cargo,
        format!(
            "#!/bin/sh\n\
             [ \"$1 $2 $3 $4 $5\" = \"run --release -p brokkr --\" ] \\\n\
             \x20 || {{ echo \"cargo stand-in: not what the README runs: $*\" >&2; exit 2; }}\n\
             shift 5\nexec {BIN} \"$@\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (copy, format!("{}:{}", shims.display(), path(dir)))
}

/// The README's set-up, five-minute walkthrough and local sections, every `sh` block as printed,
/// in a copy of the repository's root with the default store (`sqlite://brokkr.db`, so the local
/// servers' data is in the relative `brokkr.db.d/`): the broker without credentials prints the
/// password it generated and serves the built-in catalogs; `scripts/test` is the command that runs
/// this test, so it is only checked to be there; the walkthrough's broker, in the background, then
/// its user-provided flow and the local PostgreSQL flow, each printing what the README shows.
/// Only the port is changed (with `BROKKR_LISTEN`, and in the walkthrough's URL).
#[test]
fn the_set_up_and_the_five_minute_walkthrough_run_as_written_from_a_checkout() {
    let dir = tempfile::tempdir().unwrap();
    // The local servers run as an unprivileged account when the tests run as root: it must
    // pass through the test directory to reach their data below the store.
    let open = std::os::unix::fs::PermissionsExt::from_mode(0o711);
    std::fs::set_permissions(dir.path(), open).unwrap();
    let (copy, path) = checkout(dir.path());
    let run = |script: &str| {
        let mut command = bash(script, &path, dir.path());
        command.current_dir(&copy);
        command
    };

    // Set up: the broker with nothing configured, then the test command.
    let set_up = sh_blocks("## Set up");
    assert_eq!(set_up.len(), 2, "two sh blocks: {set_up:#?}");
    assert_eq!(set_up[0].trim(), "cargo run --release -p brokkr -- serve");
    let port = free_port().to_string();
    let log = dir.path().join("set-up.log");
    let broker = start_broker_in(run(&set_up[0]), &port, &log);
    let printed = std::fs::read_to_string(&log).unwrap();
    let password = printed
        .lines()
        .find_map(|l| l.trim().strip_prefix("password: "))
        .unwrap_or_else(|| panic!("no generated password printed: {printed}"));
    let catalog = Command::new("curl")
        .args(["-sf", "-u", &format!("brokkr:{password}")])
        .args(["-H", "X-Broker-API-Version: 2.17"])
        .arg(format!("http://127.0.0.1:{port}/v2/catalog"))
        .output()
        .unwrap();
    let catalog = String::from_utf8_lossy(&catalog.stdout);
    for service in ["user-provided", "local-postgresql", "local-redis"] {
        assert!(
            catalog.contains(&format!("\"{service}\"")),
            "{service}: {catalog}"
        );
    }
    drop(broker);
    assert!(copy.join("brokkr.db").exists(), "no ./brokkr.db");
    assert_eq!(set_up[1].trim(), "scripts/test");
    assert!(copy.join("scripts/test").is_file());

    // The walkthrough: its broker in the background, then its two blocks in another shell.
    let blocks = sh_blocks("## Five-minute walkthrough");
    assert_eq!(blocks.len(), 3, "three sh blocks: {blocks:#?}");
    assert!(
        blocks[0].contains("cargo run --release -p brokkr -- serve"),
        "{}",
        blocks[0]
    );
    let port = free_port().to_string();
    let log = dir.path().join("walkthrough.log");
    let broker = start_broker_in(run(&blocks[0]), &port, &log);
    let broker_log = || std::fs::read_to_string(&log).unwrap();
    let env = blocks[1].lines().next().unwrap().replace("8080", &port);
    assert!(env.starts_with("export BROKKR_OSB_URL="), "{env}");

    let out = run(&blocks[1].replace("8080", &port)).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\nbroker: {}",
        String::from_utf8_lossy(&out.stderr),
        broker_log()
    );
    // What the README shows each command print.
    assert!(stdout.contains("local-postgresql"), "the catalog: {stdout}");
    let shown = printed_lines(&blocks[1]);
    let header = words(&shown[0]);
    assert_eq!(header[0], "INSTANCE", "{shown:?}");
    assert!(stdout.lines().any(|l| words(l) == header), "{stdout}");
    let row = words(&shown[1]);
    assert!(
        stdout.lines().any(|l| {
            let w = words(l);
            w.len() == row.len()
                && w.iter()
                    .zip(&row)
                    .all(|(a, b)| a == b || is_uuid(a) && is_uuid(b))
        }),
        "no line like {row:?}: {stdout}"
    );
    // `binding -o json`: the credentials as the README prints them (its `{...}` elided).
    let expected: serde_json::Value =
        serde_json::from_str(&shown[2..].join(" ").replace("{...}", "{}"))
            .unwrap_or_else(|e| panic!("the README's binding output: {e}: {shown:?}"));
    let printed: Vec<serde_json::Value> = stdout
        .match_indices('{')
        .filter(|(i, _)| *i == 0 || stdout[..*i].ends_with('\n'))
        .filter_map(|(i, _)| {
            let mut values = serde_json::Deserializer::from_str(&stdout[i..]).into_iter();
            values.next()?.ok()
        })
        .collect();
    let binding = printed
        .last()
        .unwrap_or_else(|| panic!("no JSON printed: {stdout}"));
    assert_eq!(binding["credentials"], expected["credentials"], "{stdout}");

    // The local section: the same environment, in the same shell as a user's second terminal.
    let local: Vec<&str> = blocks[2].lines().collect();
    assert_eq!(local.len(), 5, "one command a line: {local:?}");
    let (up, down) = local.split_at(3);
    let out = run(&format!("{env}\n{}", up.join("\n"))).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}\nbroker: {}",
        String::from_utf8_lossy(&out.stderr),
        broker_log()
    );
    assert!(
        stdout.contains("PostgreSQL 1"),
        "psql did not answer: {stdout}"
    );
    let servers: Vec<_> = std::fs::read_dir(copy.join("brokkr.db.d"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        servers.len(),
        1,
        "the server's data is not in ./brokkr.db.d/: {servers:?}"
    );
    let out = run(&format!("{env}\n{}", down.join("\n")))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}\nbroker: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        broker_log()
    );
    drop(broker);
    let servers = std::fs::read_dir(copy.join("brokkr.db.d")).unwrap().count();
    assert_eq!(servers, 0, "deprovision left a server directory");
}

/// The lines a block shows as a command's output: its comment lines right after a command.
fn printed_lines(block: &str) -> Vec<String> {
    let mut shown = Vec::new();
    let mut after_command = false;
    for line in block.lines() {
        match line.trim_start().strip_prefix("# ") {
            Some(text) if after_command => shown.push(text.to_owned()),
            Some(_) => {}
            None => after_command = !line.trim().is_empty(),
        }
    }
    shown
}

fn words(line: &str) -> Vec<&str> {
    line.split_whitespace().collect()
}

fn is_uuid(text: &str) -> bool {
    uuid::Uuid::parse_str(text).is_ok()
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
