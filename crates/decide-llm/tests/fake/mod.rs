//! A scripted HTTP/1.1 server on loopback: records every request and answers with the next scripted reply.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One recorded request.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Value,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// What the server answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A JSON body with this status.
    Json(u16, Value),
    /// A chunked `text/event-stream` body: each string is sent as `data: <string>\n\n`, in its own chunk.
    Sse(Vec<String>),
    /// A chunked `application/x-ndjson` body: one JSON value per line, each in its own chunk.
    Ndjson(Vec<Value>),
    /// Reads the request and never answers.
    Hang,
}

pub struct FakeServer {
    pub url: String,
    requests: Arc<Mutex<Vec<Recorded>>>,
}

impl FakeServer {
    /// Serves `replies` in order, one per request; a request beyond them gets a 500.
    pub async fn start(replies: Vec<Reply>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let replies = Arc::new(Mutex::new(replies.into_iter()));
        let recorded = Arc::clone(&requests);
        tokio::spawn(async move {
            loop {
                let Ok((socket, _)) = listener.accept().await else {
                    return;
                };
                let recorded = Arc::clone(&recorded);
                let replies = Arc::clone(&replies);
                tokio::spawn(async move {
                    serve(socket, recorded, replies).await;
                });
            }
        });
        FakeServer { url, requests }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.requests.lock().unwrap().clone()
    }

    pub fn bodies(&self) -> Vec<Value> {
        self.requests().into_iter().map(|r| r.body).collect()
    }
}

async fn serve(
    mut socket: TcpStream,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    replies: Arc<Mutex<std::vec::IntoIter<Reply>>>,
) {
    // Keep-alive: serve requests on this connection until the client closes it.
    loop {
        let Some(request) = read_request(&mut socket).await else {
            return;
        };
        recorded.lock().unwrap().push(request);
        let reply = replies.lock().unwrap().next();
        let ok = match reply {
            Some(Reply::Json(status, body)) => {
                let body = body.to_string();
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                socket.write_all(head.as_bytes()).await.is_ok()
                    && socket.write_all(body.as_bytes()).await.is_ok()
            }
            Some(Reply::Sse(events)) => {
                let pieces = events
                    .into_iter()
                    .map(|e| format!("data: {e}\n\n"))
                    .collect();
                chunked(&mut socket, "text/event-stream", pieces).await
            }
            Some(Reply::Ndjson(lines)) => {
                let pieces = lines.into_iter().map(|l| format!("{l}\n")).collect();
                chunked(&mut socket, "application/x-ndjson", pieces).await
            }
            Some(Reply::Hang) => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                false
            }
            None => {
                let body = r#"{"error": {"message": "the script has ended"}}"#;
                let head = format!(
                    "HTTP/1.1 500 X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                socket.write_all(head.as_bytes()).await.is_ok()
                    && socket.write_all(body.as_bytes()).await.is_ok()
            }
        };
        if !ok {
            return;
        }
    }
}

/// Writes a chunked body, one chunk per piece, pausing between them so the client sees them arrive separately.
async fn chunked(socket: &mut TcpStream, content_type: &str, pieces: Vec<String>) -> bool {
    let head = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    if socket.write_all(head.as_bytes()).await.is_err() {
        return false;
    }
    for piece in pieces {
        let chunk = format!("{:x}\r\n{piece}\r\n", piece.len());
        if socket.write_all(chunk.as_bytes()).await.is_err() {
            return false;
        }
        let _ = socket.flush().await;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    socket.write_all(b"0\r\n\r\n").await.is_ok()
}

async fn read_request(socket: &mut TcpStream) -> Option<Recorded> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end;
        }
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buffer[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut start = lines.next()?.split(' ');
    let method = start.next()?.to_owned();
    let path = start.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buffer[head_end + 4..].to_vec();
    while body.len() < length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    Some(Recorded {
        method,
        path,
        headers,
        body,
    })
}
