//! A fake kubelet for tests (this crate's and, with the feature `fake`, other crates'): a
//! PodResources server on a unix socket in a temporary directory that answers (at once or
//! late), answers with a gRPC error, accepts and never answers, closes, or speaks garbage;
//! it counts the connections it was asked on.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::io::Write;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, Response};
use prost::Message;

use crate::{grpc, v1};

/// What the fake kubelet does with each connection.
#[derive(Debug, Clone)]
pub enum Behaviour {
    /// Answers every call with this message after this delay.
    Answer(Vec<u8>, Duration),
    /// Answers with a gRPC error (trailers only).
    Status(u32, &'static str),
    /// Accepts and never reads or writes.
    Hung,
    /// Accepts and closes at once.
    Close,
    /// Writes bytes that are not HTTP/2.
    Garbage,
}

#[derive(Debug)]
pub struct FakeKubelet {
    dir: tempfile::TempDir,
    calls: Arc<AtomicUsize>,
}

impl FakeKubelet {
    /// A fake kubelet behaving so on `kubelet.sock` in a new temporary directory.
    pub fn start(behaviour: Behaviour) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = UnixListener::bind(dir.path().join("kubelet.sock")).expect("bind");
        let calls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&calls);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                counted.fetch_add(1, Ordering::SeqCst);
                let behaviour = behaviour.clone();
                std::thread::spawn(move || serve(stream, behaviour));
            }
        });
        Self { dir, calls }
    }

    /// Answers `Get` with this pod, at once.
    pub fn answering(pod: v1::PodResources) -> Self {
        let answer = v1::GetPodResourcesResponse {
            pod_resources: Some(pod),
        };
        Self::start(Behaviour::Answer(answer.encode_to_vec(), Duration::ZERO))
    }

    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("kubelet.sock")
    }

    /// The temporary directory the socket is in (for a kubelet configuration beside it).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// How many connections it was asked on (one per call of the client).
    pub fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn serve(mut stream: std::os::unix::net::UnixStream, behaviour: Behaviour) {
    match behaviour {
        Behaviour::Hung => {
            std::thread::sleep(Duration::from_secs(30));
        }
        Behaviour::Close => drop(stream),
        Behaviour::Garbage => {
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\nnot http/2 at all");
            std::thread::sleep(Duration::from_millis(500));
        }
        Behaviour::Answer(..) | Behaviour::Status(..) => {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            runtime.block_on(async move {
                stream.set_nonblocking(true).expect("nonblocking");
                let stream = tokio::net::UnixStream::from_std(stream).expect("tokio stream");
                let Ok(mut conn) = h2::server::handshake(stream).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let mut body = request.into_body();
                    while let Some(Ok(_)) = body.data().await {}
                    let head = Response::builder()
                        .status(200)
                        .header("content-type", "application/grpc");
                    match &behaviour {
                        Behaviour::Answer(message, delay) => {
                            tokio::time::sleep(*delay).await;
                            let Ok(head) = head.body(()) else { return };
                            let Ok(mut send) = respond.send_response(head, false) else {
                                return;
                            };
                            let framed = grpc::frame(message).expect("frames");
                            let _ = send.send_data(framed, false);
                            let mut trailers = HeaderMap::new();
                            trailers.insert("grpc-status", "0".parse().expect("value"));
                            let _ = send.send_trailers(trailers);
                        }
                        Behaviour::Status(code, message) => {
                            let Ok(head) = head
                                .header("grpc-status", code.to_string())
                                .header("grpc-message", *message)
                                .body(())
                            else {
                                return;
                            };
                            let _ = respond.send_response(head, true);
                        }
                        _ => return,
                    }
                }
            });
        }
    }
}
