//! `brokkr-bench-static`: the upper bound of `brokkr bench --scenario catalog` on a machine.
//!
//! It answers `GET /v2/catalog` with exactly the bytes brokkr serves for a configuration (built by
//! the same [`brokkr_blueprint::Config::catalog_json`]) after the same platform authentication
//! check ([`brokkr_broker::Auth`]: SHA-256 digests compared in constant time), and nothing else:
//! no store, no engine, no other middleware. `bench/run` measures brokkr against it to tell how
//! much of the HTTP limit of the machine brokkr reaches. It is a separate binary so that it never
//! ends up in `brokkr`.
//!
//! Usage: `brokkr-bench-static LISTEN_ADDR [CONFIG]`, with the credentials in
//! `BROKKR_BROKER_USERNAME` and `BROKKR_BROKER_PASSWORD`; without CONFIG, the built-in quickstart.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow};
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use brokkr_blueprint::QUICKSTART;
use brokkr_blueprint::load::{load_path, load_str};
use brokkr_broker::Auth;

struct Static {
    auth: Auth,
    catalog: Arc<[u8]>,
}

async fn catalog(State(state): State<Arc<Static>>, request: Request) -> Response {
    let ok = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| state.auth.accepts(v));
    if !ok {
        let mut response = StatusCode::UNAUTHORIZED.into_response();
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"brokkr\""),
        );
        return response;
    }
    (
        [(header::CONTENT_TYPE, "application/json")],
        state.catalog.to_vec(),
    )
        .into_response()
}

#[tokio::main]
async fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args
        .next()
        .context("usage: brokkr-bench-static LISTEN_ADDR [CONFIG]")?
        .parse()
        .context("LISTEN_ADDR must be an address such as 127.0.0.1:8081")?;
    let config = match args.next() {
        Some(path) => load_path(Path::new(&path)),
        None => load_str("<built-in quickstart>", QUICKSTART),
    }
    .map_err(|e| anyhow!("{e}"))?;
    let username = std::env::var("BROKKR_BROKER_USERNAME").context("BROKKR_BROKER_USERNAME")?;
    let password = std::env::var("BROKKR_BROKER_PASSWORD").context("BROKKR_BROKER_PASSWORD")?;
    let state = Arc::new(Static {
        auth: Auth::default().basic(&username, &password),
        catalog: config.catalog_json(),
    });
    let app = Router::new()
        .route("/v2/catalog", get(catalog))
        .with_state(state);
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    eprintln!("brokkr-bench-static listening on {listen}");
    axum::serve(listener, app).await?;
    Ok(())
}
