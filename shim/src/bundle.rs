//! The wrapper's file in a task's bundle: what `start` leaves there for `delete` (and for a
//! later `start`) — which daemon serves the pod and which delegate it forwards to.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file's name, beside the bundle's `config.json` and `address`.
pub const BUNDLE_FILE: &str = "kata-topo.json";

/// What the bundle remembers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleInfo {
    /// The wrapper's address (also in `address`).
    pub address: String,
    pub delegate_address: String,
    /// The delegate's task API version.
    pub delegate_version: u32,
    /// The pod group.
    pub group: String,
    /// The containerd namespace.
    pub namespace: String,
    /// The delegate binary (`delete` runs it; it has no runtime options to find the config).
    pub delegate_shim: String,
    pub state_dir: PathBuf,
    /// The metrics directory, when the daemon writes a metrics file (`delete` removes the
    /// file of a daemon that died).
    #[serde(default)]
    pub metrics_dir: Option<PathBuf>,
}

impl BundleInfo {
    /// Reads `<bundle>/kata-topo.json`; `None` when it is missing or not this format.
    pub fn read(bundle: &Path) -> Option<Self> {
        let bytes = std::fs::read(bundle.join(BUNDLE_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Points the bundle at the wrapper: its `address` file (what containerd dials) and
    /// `kata-topo.json`.
    pub fn write(&self, bundle: &Path) -> std::io::Result<()> {
        std::fs::write(bundle.join("address"), &self.address)?;
        std::fs::write(
            bundle.join(BUNDLE_FILE),
            serde_json::to_vec(self).map_err(std::io::Error::other)?,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_start_writes_delete_reads_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(BundleInfo::read(dir.path()), None, "no file");
        let info = BundleInfo {
            address: "unix:///run/containerd/s/abc".into(),
            delegate_address: "unix:///run/containerd/s/def".into(),
            delegate_version: 3,
            group: "sb1".into(),
            namespace: "k8s.io".into(),
            delegate_shim: "containerd-shim-kata-v2".into(),
            state_dir: "/run/kata-topo".into(),
            metrics_dir: None,
        };
        info.write(dir.path()).expect("write");
        assert_eq!(BundleInfo::read(dir.path()), Some(info));
        assert_eq!(
            std::fs::read_to_string(dir.path().join("address")).expect("address"),
            "unix:///run/containerd/s/abc"
        );
        std::fs::write(dir.path().join(BUNDLE_FILE), b"{\"address\":1}").expect("garbage");
        assert_eq!(BundleInfo::read(dir.path()), None, "not this format");
    }
}
