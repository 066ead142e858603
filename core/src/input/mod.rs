//! What a request brings in from Kubernetes and containerd, as domain types: the container's
//! OCI spec and resources ([`spec`]), Kata's configuration and the pod's Kata annotations
//! ([`kata`]), what the kubelet says of the pod ([`kubelet`]) and the pod's node affinity
//! against its node's labels ([`affinity`]). Parsing only: what they mean for a request is
//! worked out in [`crate::check`].

pub mod affinity;
pub mod kata;
pub mod kubelet;
pub mod spec;
