//! Bearer-token check for the guarded routes.

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::AppState;
use super::routes::error;

pub(super) async fn require_token(
    State(s): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    match &s.token {
        Some(token) if !authorized(token.expose(), request.headers()) => {
            let mut r =
                error(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"streamstate\""),
            );
            r
        }
        _ => next.run(request).await,
    }
}

/// Compares digests in constant time, so neither the token's bytes nor its length leak
/// through response timing.
fn authorized(token: &str, headers: &HeaderMap) -> bool {
    let Some(given) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
    else {
        return false;
    };
    let Some(given) = given.strip_prefix("Bearer ").map(str::trim) else {
        return false;
    };
    Sha256::digest(given.as_bytes())
        .ct_eq(&Sha256::digest(token.as_bytes()))
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(v).expect("header"),
        );
        h
    }

    #[test]
    fn only_the_exact_bearer_token_passes() {
        assert!(authorized("s3cret", &headers("Bearer s3cret")));
        assert!(!authorized("s3cret", &headers("Bearer s3cre")));
        assert!(!authorized("s3cret", &headers("Bearer s3cretX")));
        assert!(!authorized("s3cret", &headers("Basic s3cret")));
        assert!(!authorized("s3cret", &headers("s3cret")));
        assert!(!authorized("s3cret", &HeaderMap::new()));
    }
}
