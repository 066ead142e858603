//! The wrapper's failures on the request path, and the one place they become ttrpc statuses.

use kata_topo_proto::wire::{Code, Status};

/// A request the wrapper answers itself instead of the delegate.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// Enforce mode refused the request; the message names rule, expectation, finding, pod.
    #[error("{0}")]
    Rejected(String),
    /// The delegate could not be reached.
    #[error("kata-topo: the delegate shim at {address} is unavailable")]
    DelegateUnavailable {
        address: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
    /// A ttrpc request that does not decode.
    #[error("kata-topo: malformed ttrpc request: {0}")]
    BadRequest(String),
}

impl ShimError {
    /// The gRPC code containerd (and CRI, and the kubelet) sees. FailedPrecondition,
    /// Unavailable and InvalidArgument survive containerd → CRI → kubelet unchanged.
    pub fn code(&self) -> Code {
        match self {
            Self::Rejected(_) => Code::FailedPrecondition,
            Self::DelegateUnavailable { .. } => Code::Unavailable,
            Self::BadRequest(_) => Code::InvalidArgument,
        }
    }

    /// The status to send: the message with its causes.
    pub fn status(&self) -> Status {
        Status {
            code: self.code() as i32,
            message: kata_topo_core::text::error_chain(self),
            details: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_arm_maps_to_its_code() {
        let rejected = ShimError::Rejected("kata-topo: refused".into());
        assert_eq!(rejected.code(), Code::FailedPrecondition);
        assert_eq!(rejected.status().code, 9);
        assert_eq!(rejected.status().message, "kata-topo: refused");
        let down = ShimError::DelegateUnavailable {
            address: "unix:///run/x".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        assert_eq!(down.status().code, 14);
        assert_eq!(
            down.status().message,
            format!(
                "kata-topo: the delegate shim at unix:///run/x is unavailable: {}",
                std::io::Error::from(std::io::ErrorKind::ConnectionRefused)
            ),
            "the cause, once"
        );
        let bad = ShimError::BadRequest("truncated".into());
        assert_eq!(bad.status().code, 3);
    }
}
