//! A real HTTP upstream for tests: a hyper server on 127.0.0.1:0 with a few
//! endpoints that report what they received.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub struct Upstream {
    pub addr: SocketAddr,
    pub connections: Arc<AtomicUsize>,
    pub requests: Arc<AtomicUsize>,
    pub name: &'static str,
}

impl Upstream {
    pub fn target(&self) -> String {
        format!("http://{}", self.addr)
    }
}

/// Starts an upstream on the current tokio runtime.
///
/// - `/headers`: JSON `{method, path, headers: {name: [values]}}`
/// - `/id?set=V`: as `/headers`, answered with `x-request-id: V` (none
///   without `set`)
/// - `/sha256`: streams the body, answers `<hex> <bytes>`
/// - `/slow?ms=N`: answers after N ms
/// - `/big?mb=N`: answers N MiB of `x`
/// - `/ws`: upgrades and echoes bytes
/// - anything else: `upstream <name> ok`
pub async fn start(name: &'static str) -> Upstream {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(AtomicUsize::new(0));
    let (c, r) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            c.fetch_add(1, Ordering::SeqCst);
            let r = r.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    r.fetch_add(1, Ordering::SeqCst);
                    handle(req, name)
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .with_upgrades()
                    .await;
            });
        }
    });
    Upstream {
        addr,
        connections,
        requests,
        name,
    }
}

async fn handle(mut req: Request<Incoming>, name: &'static str) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let resp = match path.as_str() {
        "/headers" | "/v1/headers" | "/id" => {
            let mut headers: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for (k, v) in req.headers() {
                headers
                    .entry(k.as_str().to_string())
                    .or_default()
                    .push(v.to_str().unwrap_or("").to_string());
            }
            let body = serde_json::json!({
                "upstream": name,
                "method": req.method().as_str(),
                "path": req.uri().path_and_query().map(|p| p.as_str()).unwrap_or(""),
                "version": format!("{:?}", req.version()),
                "headers": headers,
            });
            let mut resp = Response::new(Full::new(Bytes::from(body.to_string())));
            if let Some(id) = query.strip_prefix("set=").filter(|_| path == "/id") {
                resp.headers_mut().insert("x-request-id", id.parse().unwrap());
            }
            resp
        }
        "/sha256" => {
            let mut hasher = Sha256::new();
            let mut total = 0usize;
            let mut body = req.into_body();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else { break };
                if let Some(data) = frame.data_ref() {
                    total += data.len();
                    hasher.update(data);
                }
            }
            let hex: String = hasher.finalize().iter().map(|b| format!("{b:02x}")).collect();
            Response::new(Full::new(Bytes::from(format!("{hex} {total}"))))
        }
        "/big" => {
            let mb: usize = query.strip_prefix("mb=").and_then(|v| v.parse().ok()).unwrap_or(1);
            Response::new(Full::new(Bytes::from(vec![b'x'; mb << 20])))
        }
        "/slow" => {
            let ms: u64 = query.strip_prefix("ms=").and_then(|v| v.parse().ok()).unwrap_or(1000);
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Response::new(Full::new(Bytes::from("slow done")))
        }
        "/ws" => {
            let on_upgrade = hyper::upgrade::on(&mut req);
            tokio::spawn(async move {
                if let Ok(upgraded) = on_upgrade.await {
                    let mut io = TokioIo::new(upgraded);
                    let mut buf = [0u8; 1024];
                    loop {
                        match io.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if io.write_all(&buf[..n]).await.is_err() {
                                    break;
                                }
                            }
                        }
                    }
                }
            });
            Response::builder()
                .status(StatusCode::SWITCHING_PROTOCOLS)
                .header("connection", "upgrade")
                .header("upgrade", "websocket")
                .header("sec-websocket-accept", "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=")
                .body(Full::new(Bytes::new()))
                .unwrap()
        }
        _ => Response::builder()
            .header("keep-alive", "timeout=5")
            .header("x-upstream", name)
            .body(Full::new(Bytes::from(format!("upstream {name} ok"))))
            .unwrap(),
    };
    Ok(resp)
}
