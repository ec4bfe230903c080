//! The admin plane's responses: a text or JSON body with its type. Below
//! both the listener (`admin.rs`) and the overrides API (`overrides.rs`),
//! which answer with them.

use http::header::CONTENT_TYPE;
use http::{HeaderValue, Response, StatusCode};

use crate::proxy::body::Body;

pub(super) fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Body> {
    let mut resp = Response::new(Body::full(body));
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

pub(super) fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    text(status, "application/json", format!("{body}\n"))
}
