//! One unary gRPC call over HTTP/2 on a connected stream: the request framed as gRPC's
//! length-prefixed message, the answer's one message read back (at most
//! [`MAX_MESSAGE_BYTES`]) with its `grpc-status`. Nothing else of gRPC (streams, compression,
//! retries) is needed to ask the kubelet one question.

use bytes::{BufMut, Bytes, BytesMut};
use http::{HeaderMap, Request, StatusCode};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::KubeletError;

/// The largest answer accepted: gRPC's own default receive limit. A node's `List` with a
/// hundred pods is a few tens of KiB.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The largest header block accepted from the server.
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// Frames one message as gRPC does: a zero byte (not compressed), its length (big endian),
/// the message.
pub fn frame(message: &[u8]) -> Result<Bytes, KubeletError> {
    let len = u32::try_from(message.len())
        .map_err(|_| KubeletError::Garbage("the request is too large to frame".into()))?;
    let mut out = BytesMut::with_capacity(5 + message.len());
    out.put_u8(0);
    out.put_u32(len);
    out.put_slice(message);
    Ok(out.freeze())
}

/// The one message of a unary answer's body: exactly one uncompressed length-prefixed
/// message of at most `limit` bytes, nothing before or after it.
pub fn unframe(body: &[u8], limit: usize) -> Result<&[u8], KubeletError> {
    let garbage = |why: &str| KubeletError::Garbage(why.to_string());
    let (&flag, rest) = body
        .split_first()
        .ok_or_else(|| garbage("the answer has no message"))?;
    if flag != 0 {
        return Err(garbage("the answer is compressed or not a gRPC message"));
    }
    let (len, message) = rest
        .split_at_checked(4)
        .ok_or_else(|| garbage("the answer's message is cut short"))?;
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    if len > limit {
        return Err(KubeletError::TooLarge(limit));
    }
    match message.len().cmp(&len) {
        std::cmp::Ordering::Equal => Ok(message),
        std::cmp::Ordering::Less => Err(garbage("the answer's message is cut short")),
        std::cmp::Ordering::Greater => Err(garbage("the answer has more than one message")),
    }
}

/// The gRPC status a header block carries, if any: `(code, message)`.
fn status(headers: &HeaderMap) -> Option<(u32, String)> {
    let code = headers.get("grpc-status")?;
    let code = code.to_str().ok()?.trim().parse().ok()?;
    let message = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .map(|m| m.chars().take(256).collect())
        .unwrap_or_default();
    Some((code, message))
}

/// Calls `path` (`/package.Service/Method`) with `message` on `io` and returns the answer's
/// message bytes, at most `limit` of them (never more than [`MAX_MESSAGE_BYTES`]): a longer
/// answer is refused as soon as its length says so. The caller bounds it in time.
pub async fn unary<T>(
    io: T,
    path: &str,
    message: &[u8],
    limit: usize,
) -> Result<Vec<u8>, KubeletError>
where
    T: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (client, connection) = h2::client::Builder::new()
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .handshake::<_, Bytes>(io)
        .await
        .map_err(protocol)?;
    // The connection is driven beside the call; it ends when the client is dropped.
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let result = call(client, path, message, limit.min(MAX_MESSAGE_BYTES)).await;
    driver.abort();
    result
}

async fn call(
    client: h2::client::SendRequest<Bytes>,
    path: &str,
    message: &[u8],
    limit: usize,
) -> Result<Vec<u8>, KubeletError> {
    let mut client = client.ready().await.map_err(protocol)?;
    let request = Request::post(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .map_err(|e| KubeletError::Garbage(e.to_string()))?;
    let (response, mut send) = client.send_request(request, false).map_err(protocol)?;
    send.send_data(frame(message)?, true).map_err(protocol)?;
    let response = response.await.map_err(protocol)?;
    let (head, mut body) = response.into_parts();
    if head.status != StatusCode::OK {
        return Err(KubeletError::Garbage(format!(
            "the answer's HTTP status is {}",
            head.status.as_u16()
        )));
    }
    let grpc = head
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        return Err(KubeletError::Garbage("the answer is not gRPC".into()));
    }
    // A trailers-only answer (an error) carries its status in the headers.
    if let Some((code, message)) = status(&head.headers) {
        if code != 0 {
            return Err(KubeletError::Status { code, message });
        }
    }
    let mut buf = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(protocol)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if buf.len() + chunk.len() > limit + 5 {
            return Err(KubeletError::TooLarge(limit));
        }
        buf.extend_from_slice(&chunk);
        // The length prefix says how long the message is: refuse a long one at once.
        if let Some(len) = buf.get(1..5) {
            let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
            if len > limit {
                return Err(KubeletError::TooLarge(limit));
            }
        }
    }
    let trailers = body.trailers().await.map_err(protocol)?;
    match trailers
        .as_ref()
        .and_then(status)
        .or_else(|| status(&head.headers))
    {
        Some((0, _)) => {
            let message = unframe(&buf, limit)?.len();
            // The message without its prefix, in the same allocation.
            buf.drain(..buf.len() - message);
            Ok(buf)
        }
        Some((code, message)) => Err(KubeletError::Status { code, message }),
        None => Err(KubeletError::Garbage(
            "the answer carries no grpc-status".into(),
        )),
    }
}

fn protocol(e: h2::Error) -> KubeletError {
    match e.get_io() {
        Some(io) => KubeletError::Closed(io.to_string()),
        None => KubeletError::Protocol(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn frames_and_unframes_one_message() {
        let framed = frame(b"abc").expect("frames");
        assert_eq!(&framed[..], &[0, 0, 0, 0, 3, b'a', b'b', b'c']);
        assert_eq!(
            unframe(&framed, MAX_MESSAGE_BYTES).expect("one message"),
            b"abc"
        );
        assert_eq!(
            unframe(&[0, 0, 0, 0, 0], MAX_MESSAGE_BYTES).expect("empty message"),
            b""
        );
        for bad in [
            &[][..],
            &[1, 0, 0, 0, 0],
            &[0, 0, 0],
            &[0, 0, 0, 0, 4, 1],
            &[0, 0, 0, 0, 1, 1, 2],
        ] {
            assert!(
                matches!(
                    unframe(bad, MAX_MESSAGE_BYTES),
                    Err(KubeletError::Garbage(_))
                ),
                "{bad:?}"
            );
        }
        assert!(matches!(
            unframe(&[0, 0xff, 0xff, 0xff, 0xff], MAX_MESSAGE_BYTES),
            Err(KubeletError::TooLarge(MAX_MESSAGE_BYTES))
        ));
        assert!(matches!(
            unframe(&[0, 0, 0, 0, 3, 1, 2, 3], 2),
            Err(KubeletError::TooLarge(2))
        ));
    }

    proptest! {
        #[test]
        fn unframing_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = unframe(&bytes, MAX_MESSAGE_BYTES);
        }

        #[test]
        fn a_framed_message_unframes_to_itself(message in proptest::collection::vec(any::<u8>(), 0..256)) {
            let framed = frame(&message).expect("frames");
            prop_assert_eq!(unframe(&framed, MAX_MESSAGE_BYTES).expect("unframes"), &message[..]);
        }
    }
}
