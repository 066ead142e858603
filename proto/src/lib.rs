//! The protobuf messages kata-topo exchanges with containerd and the delegate shim, generated
//! at build time from containerd's and ttrpc's own `.proto` files (vendored under `protos/`,
//! Apache-2.0; see `protos/README.md`). Modules follow the protobuf packages:
//!
//! - [`containerd::runtime::bootstrap::v1`]: `BootstrapParams` (what containerd ≥ 2.3 writes
//!   to a shim's `start`) and `BootstrapResult` (what `start` answers);
//! - [`containerd::task::v2`]: the task API's messages (`containerd.task.v3.Task` uses the
//!   same messages under another service name);
//! - [`containerd::services::events::ttrpc::v1`] and [`containerd::types`]: `ForwardRequest`
//!   and its `Envelope`, for publishing events;
//! - [`runtimeoptions::v1`]: `Options`, the runtime options CRI passes a non-runc shim;
//! - [`nri::pkg::api::v1alpha1`]: NRI's messages (containerd/nri v0.12.0), for `kata-topo-nri`;
//! - [`ttrpc`] and [`google::rpc`]: the ttrpc `Request`, `Response`, `KeyValue` and the
//!   status they carry.
//!
//! [`wire`] frames these messages on a ttrpc connection (the wrapper's proxy, its events, its
//! calls to the delegate); [`bootstrap`] decodes `start`'s stdin (either protocol) and the delegate's answer with these
//! types, and answers in the same format.
//!
//! `google.protobuf.*` maps to `prost_types` (`Any`, `Timestamp`), and a
//! `google.protobuf.StringValue` is prost's `String` message.

pub mod bootstrap;
pub mod wire;

pub use prost;
pub use prost_types;

#[allow(
    missing_docs,
    missing_debug_implementations,
    unused_qualifications,
    clippy::all,
    clippy::pedantic
)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/protos.rs"));
}

pub use generated::*;

use prost::bytes::Buf;
use prost::encoding::{decode_key, encode_key, encode_varint, skip_field, DecodeContext, WireType};
use prost::DecodeError;

/// Why a message could not be rewritten.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The bytes are not a protobuf message.
    #[error("not a protobuf message")]
    Decode(#[from] DecodeError),
    /// The field to replace holds something other than a string.
    #[error("field {0} is not length-delimited")]
    NotLengthDelimited(u32),
}

impl ttrpc::Response {
    /// The status code (0, OK, when the status is absent).
    pub fn code(&self) -> i32 {
        self.status.as_ref().map_or(0, |s| s.code)
    }
}

impl ttrpc::Request {
    /// The encoded request `bytes` with its `service` (field 1) set to `service`; every other
    /// field, known to this crate or not, is kept byte for byte and in its place. A proxy that
    /// decoded and re-encoded the request would drop the fields it does not know.
    pub fn with_service(bytes: &[u8], service: &str) -> Result<Vec<u8>, WireError> {
        with_string_field(bytes, 1, service)
    }
}

/// `message` with every occurrence of the length-delimited field `tag` replaced by one
/// occurrence holding `value` (where the first one was, or at the end), all other fields
/// copied unchanged. Fails on bytes that are not a protobuf message.
pub fn with_string_field(message: &[u8], tag: u32, value: &str) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::with_capacity(message.len() + value.len());
    let mut rest = message;
    let mut written = false;
    let put = |out: &mut Vec<u8>| {
        encode_key(tag, WireType::LengthDelimited, out);
        encode_varint(value.len() as u64, out);
        out.extend_from_slice(value.as_bytes());
    };
    while rest.has_remaining() {
        let start = rest;
        let (field, wire_type) = decode_key(&mut rest)?;
        skip_field(wire_type, field, &mut rest, DecodeContext::default())?;
        let consumed = start.len() - rest.len();
        if field == tag {
            if wire_type != WireType::LengthDelimited {
                return Err(WireError::NotLengthDelimited(tag));
            }
            if !written {
                put(&mut out);
                written = true;
            }
        } else {
            out.extend_from_slice(&start[..consumed]);
        }
    }
    if !written {
        put(&mut out);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    fn request() -> ttrpc::Request {
        ttrpc::Request {
            service: "containerd.task.v2.Task".into(),
            method: "State".into(),
            payload: vec![0x0a, 0x02, b'c', b'1'],
            timeout_nano: 5_000_000_000,
            metadata: vec![ttrpc::KeyValue {
                key: "containerd-namespace-ttrpc".into(),
                value: "k8s.io".into(),
            }],
        }
    }

    #[test]
    fn renaming_the_service_keeps_every_other_byte() {
        let mut bytes = request().encode_to_vec();
        // Fields this crate does not know: a varint 6, a fixed64 7, a string 99.
        let unknown = {
            let mut u = Vec::new();
            encode_key(6, WireType::Varint, &mut u);
            encode_varint(300, &mut u);
            encode_key(7, WireType::SixtyFourBit, &mut u);
            u.extend_from_slice(&42u64.to_le_bytes());
            prost::encoding::string::encode(99, &"future".to_string(), &mut u);
            u
        };
        bytes.extend_from_slice(&unknown);
        let renamed =
            ttrpc::Request::with_service(&bytes, "containerd.task.v3.Task").expect("rename");
        let back = ttrpc::Request::decode(renamed.as_slice()).expect("decode");
        assert_eq!(back.service, "containerd.task.v3.Task");
        assert_eq!(
            ttrpc::Request {
                service: String::new(),
                ..back
            },
            ttrpc::Request {
                service: String::new(),
                ..request()
            }
        );
        assert!(
            renamed.ends_with(&unknown),
            "unknown fields kept byte for byte"
        );
        // Everything after the service field is the original bytes.
        let original_service_len = 2 + "containerd.task.v2.Task".len();
        let renamed_service_len = 2 + "containerd.task.v3.Task".len();
        assert_eq!(
            &renamed[renamed_service_len..],
            &bytes[original_service_len..]
        );
        // Renaming to the same name is the identity.
        assert_eq!(
            ttrpc::Request::with_service(&bytes, "containerd.task.v2.Task").expect("same"),
            bytes
        );
    }

    #[test]
    fn renaming_adds_a_missing_service_and_rejects_garbage() {
        let mut r = request();
        r.service.clear();
        let bytes = r.encode_to_vec();
        let renamed = ttrpc::Request::with_service(&bytes, "x.Y").expect("rename");
        assert_eq!(
            ttrpc::Request::decode(renamed.as_slice())
                .expect("decode")
                .service,
            "x.Y"
        );
        assert!(
            ttrpc::Request::with_service(&[0x0a, 0x09, b'a'], "x").is_err(),
            "truncated"
        );
        assert!(
            ttrpc::Request::with_service(&[0xff; 11], "x").is_err(),
            "bad varint"
        );
        // Field 1 as a varint is not a request.
        assert_eq!(
            ttrpc::Request::with_service(&[0x08, 0x01], "x"),
            Err(WireError::NotLengthDelimited(1))
        );
        assert_eq!(
            ttrpc::Request::with_service(&[], "x").expect("empty message"),
            vec![0x0a, 0x01, b'x']
        );
    }

    proptest::proptest! {
        /// Any bytes: an error or a message whose service is the new one and whose other
        /// fields are those of the input; never a panic.
        #[test]
        fn renaming_never_panics_and_keeps_the_rest(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..256),
            service in "[a-z.]{0,40}",
        ) {
            if let Ok(renamed) = ttrpc::Request::with_service(&bytes, &service) {
                if let (Ok(before), Ok(after)) = (
                    ttrpc::Request::decode(bytes.as_slice()),
                    ttrpc::Request::decode(renamed.as_slice()),
                ) {
                    proptest::prop_assert_eq!(&after.service, &service);
                    proptest::prop_assert_eq!(
                        ttrpc::Request { service: String::new(), ..after },
                        ttrpc::Request { service: String::new(), ..before }
                    );
                }
            }
        }
    }

    #[test]
    fn response_code_is_ok_without_a_status() {
        assert_eq!(ttrpc::Response::default().code(), 0);
        let r = ttrpc::Response {
            status: Some(google::rpc::Status {
                code: 9,
                ..Default::default()
            }),
            payload: vec![],
        };
        assert_eq!(r.code(), 9);
    }

    #[test]
    fn string_value_is_prosts_string_message() {
        // google.protobuf.StringValue { value = 1 }: what kata-topo's events carry.
        let bytes = "verdict".to_string().encode_to_vec();
        assert_eq!(bytes, [&[0x0a, 7][..], b"verdict"].concat());
        assert_eq!(String::decode(bytes.as_slice()).expect("decode"), "verdict");
    }
}
