//! Where the store's encryption keys come from.
//!
//! In order: `BROKKR_ENCRYPTION_KEY` (base64 keys separated by commas, newest first), the key file
//! given by `--encryption-key-file` (one base64 key per line, newest first, `#` comments). With
//! neither, a SQLite store gets a key file of its own beside the database (`brokkr.db.key`,
//! created with mode 0600 on first start); a PostgreSQL store, shared by replicas, must be given
//! its keys. `--insecure-plaintext-secrets` stores secrets unencrypted instead.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use brokkr_engine::crypto::Keyring;
use clap::Args;
use tracing::{info, warn};

/// Environment variable holding encryption keys.
pub const KEY_ENV: &str = "BROKKR_ENCRYPTION_KEY";

/// Flags that choose the encryption keys.
#[derive(Args, Clone)]
pub struct KeyArgs {
    /// File of base64 AES-256 keys, one per line, newest (the one that encrypts) first.
    /// BROKKR_ENCRYPTION_KEY (comma-separated keys) takes precedence.
    #[arg(long, env = "BROKKR_ENCRYPTION_KEY_FILE")]
    encryption_key_file: Option<PathBuf>,
    /// Store credentials and parameters unencrypted. Not for production.
    #[arg(long)]
    insecure_plaintext_secrets: bool,
}

/// The keyring for `store_url`, creating a SQLite store's own key file when `create` is set.
pub fn keyring(args: &KeyArgs, store_url: &str, create: bool) -> Result<Option<Keyring>> {
    if let Ok(keys) = std::env::var(KEY_ENV) {
        let ring = Keyring::from_base64(keys.split(',').filter(|k| !k.trim().is_empty()))
            .context(KEY_ENV)?;
        return Ok(Some(ring));
    }
    if let Some(file) = &args.encryption_key_file {
        return read_key_file(file).map(Some);
    }
    if args.insecure_plaintext_secrets {
        warn!("secrets are stored unencrypted (--insecure-plaintext-secrets)");
        return Ok(None);
    }
    let Some(db) = sqlite_path(store_url) else {
        bail!(
            "the store is shared, so its encryption keys must be given: set {KEY_ENV} or \
             --encryption-key-file (the same keys on every replica), or pass \
             --insecure-plaintext-secrets"
        );
    };
    let file = PathBuf::from(format!("{}.key", db.display()));
    if !file.exists() {
        if !create {
            bail!("no encryption key: {} does not exist", file.display());
        }
        write_new_key_file(&file)?;
        info!(file = %file.display(), "generated the store's encryption key; back it up with the database");
    }
    read_key_file(&file).map(Some)
}

fn read_key_file(file: &Path) -> Result<Keyring> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("cannot read the encryption key file {}", file.display()))?;
    let keys = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'));
    Keyring::from_base64(keys).with_context(|| format!("encryption key file {}", file.display()))
}

fn write_new_key_file(file: &Path) -> Result<()> {
    use std::io::Write as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(file)
        .with_context(|| format!("cannot create the encryption key file {}", file.display()))?;
    writeln!(
        f,
        "# brokkr store encryption keys, newest first. Losing this file loses the stored credentials.\n{}",
        Keyring::generate_key()
    )?;
    Ok(())
}

/// The database file of a `sqlite://` URL.
fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then(|| PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_urls_name_their_file() {
        assert_eq!(sqlite_path("sqlite://brokkr.db"), Some("brokkr.db".into()));
        assert_eq!(
            sqlite_path("sqlite:///var/lib/b.db?mode=rwc"),
            Some("/var/lib/b.db".into())
        );
        assert_eq!(sqlite_path("postgres://h/db"), None);
    }
}
