//! A store failure, and a store's URL as logs and errors show it (without its password).

/// A store failure (connection lost, database error); never caused by a request's content.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The database failed.
    #[error("store: {0}")]
    Database(#[from] sqlx::Error),
    /// A row holds something this version cannot read.
    #[error("store: corrupt row for {key}: {message}")]
    Corrupt {
        /// The resource.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// SQLite failed, on the writer's or a reader's plain connection.
    #[error("store: {0}")]
    Sqlite(String),
    /// Another process holds the SQLite store.
    #[error("store: {0}")]
    Lock(String),
    /// The store's schema is newer than this brokkr can use (a downgrade past a breaking change).
    #[error(
        "store: the store's schema is version {found}, which brokkr releases with schema version \
         {compatible_since} or later can use; this brokkr's is version {supported}. Run a newer \
         brokkr, or restore a backup of the store taken before the upgrade"
    )]
    SchemaTooNew {
        /// The version the store was migrated to.
        found: i64,
        /// The oldest schema version whose brokkr can use the store.
        compatible_since: i64,
        /// This brokkr's schema version.
        supported: i64,
    },
    /// The store URL is not one brokkr supports.
    #[error("store: unsupported URL {0:?}; use sqlite://PATH or postgres://…")]
    UnsupportedUrl(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sqlite(e.to_string())
    }
}

/// A store URL without its password, for logs and errors.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{}{user}:***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls_are_redacted() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("sqlite://brokkr.db"), "sqlite://brokkr.db");
        assert_eq!(redact_url("mysql://u:secret@h/db"), "mysql://u:***@h/db");
    }
}
