//! A pod's group and the sockets named after it: the tasks of one pod (its sandbox and its
//! containers) share one delegate and one wrapper daemon, each listening on a socket in the
//! shims' socket directory whose name derives from the group.

use std::path::Path;

use sha2::{Digest, Sha256};

/// The pod group of a task: the CRI sandbox id, runc's group annotation, else the task id.
pub fn group_of(bundle: &Path, task_id: &str) -> String {
    let spec = kata_topo_core::ContainerSpec::from_file(&bundle.join("config.json")).ok();
    spec.as_ref()
        .and_then(|s| {
            s.sandbox_id
                .clone()
                .or_else(|| s.annotations.get("io.containerd.runc.v2.group").cloned())
        })
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| task_id.to_string())
}

/// The wrapper's socket for a pod, in the shims' socket directory. Shims name theirs after
/// sha256(containerd address + "/" + namespace + "/" + group); the delegate does exactly that,
/// so the wrapper adds its own suffix and can never collide with it.
pub fn socket_address(
    socket_dir: &Path,
    containerd_address: &str,
    namespace: &str,
    group: &str,
) -> String {
    shim_socket(
        socket_dir,
        &format!("{containerd_address}/{namespace}/{group}/kata-topo"),
    )
}

/// Where a shim of the containerd shim library listens: `<socket dir>/<sha256(containerd
/// address + "/" + namespace + "/" + group)>`.
pub fn delegate_socket_address(
    socket_dir: &Path,
    containerd_address: &str,
    namespace: &str,
    group: &str,
) -> String {
    shim_socket(
        socket_dir,
        &format!("{containerd_address}/{namespace}/{group}"),
    )
}

fn shim_socket(socket_dir: &Path, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("unix://{}/{hex}", socket_dir.display())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_proto::wire::socket_path;

    #[test]
    fn socket_names_never_collide_with_the_delegate() {
        let dir = Path::new(kata_topo_proto::bootstrap::DEFAULT_SOCKET_DIR);
        let containerd = "/run/containerd/containerd.sock";
        let ours = socket_address(dir, containerd, "k8s.io", "sb1");
        let digest = Sha256::digest(b"/run/containerd/containerd.sock/k8s.io/sb1");
        let theirs: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(ours.starts_with("unix:///run/containerd/s/"));
        assert!(!ours.ends_with(&theirs));
        assert_eq!(
            delegate_socket_address(dir, containerd, "k8s.io", "sb1"),
            format!("unix:///run/containerd/s/{theirs}")
        );
        assert_ne!(ours, socket_address(dir, containerd, "k8s.io", "sb2"));
        assert_ne!(ours, socket_address(dir, containerd, "default", "sb1"));
        // containerd 2.3's socket_dir.
        let elsewhere = socket_address(Path::new("/run/k/s"), containerd, "k8s.io", "sb1");
        assert!(elsewhere.starts_with("unix:///run/k/s/"), "{elsewhere}");
        assert!(socket_path(&ours).len() < 108, "fits sun_path");
    }

    #[test]
    fn groups_by_sandbox_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(group_of(dir.path(), "task1"), "task1");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","annotations":{"io.kubernetes.cri.sandbox-id":"sb9"}}"#,
        )
        .expect("write");
        assert_eq!(group_of(dir.path(), "task1"), "sb9");
    }
}
