//! The one place the installer changes the node's files: through the host root with the
//! core's no-follow tree ([`kata_topo_core::files::Root`]), all of an install's files at once
//! or none of them.
//!
//! [`Node::apply`] makes the directories the files need (remembering the ones it made in
//! `created-dirs`), stages every file that differs beside its name (written, `fsync`ed), and
//! only then renames them over, in order, each old file linked aside first. Any failure on
//! the way undoes what was done: the staged files and the directories made go, the renamed
//! ones get their old file back. [`Applied::undo`] does the same later (containerd did not
//! load the handler); [`Applied::keep`] drops the old files.

use std::io;
use std::path::{Path, PathBuf};

use kata_topo_core::files::{Dir, Entry, Root, Staged};

/// The largest file read from the node or the image (a binary).
pub const MAX_FILE_BYTES: u64 = 512 << 20;

/// What a file on the node should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Want {
    /// A regular file with this content and mode.
    File {
        /// Its content.
        bytes: Vec<u8>,
        /// Its permission bits.
        mode: u32,
    },
    /// A symbolic link to this target.
    Link(PathBuf),
}

/// One file of an install.
#[derive(Debug, Clone)]
pub struct Change {
    /// Its absolute path on the node.
    pub path: PathBuf,
    /// What it should be.
    pub want: Want,
}

/// A failed step: what failed, and the OS's error.
#[derive(Debug, thiserror::Error)]
#[error("{what}")]
pub struct NodeError {
    /// What failed, with the path.
    pub what: String,
    /// The OS's error.
    #[source]
    pub source: io::Error,
}

impl NodeError {
    fn new(what: impl Into<String>, source: io::Error) -> Self {
        Self {
            what: what.into(),
            source,
        }
    }

    /// Whether a file system refused every write (a read-only `/usr` of an OSTree node).
    pub fn is_read_only(&self) -> bool {
        self.source.kind() == io::ErrorKind::ReadOnlyFilesystem
    }

    /// Whether a path is not trusted (a link on the way, a directory others may write).
    pub fn is_untrusted(&self) -> bool {
        kata_topo_core::files::is_untrusted(&self.source)
    }

    /// One line: what failed and why.
    pub fn line(&self) -> String {
        format!("{}: {}", self.what, self.source)
    }
}

/// The node's `/`, as this container sees it.
#[derive(Debug)]
pub struct Node {
    root: Root,
}

fn split(path: &Path) -> io::Result<(&Path, String)> {
    match (path.parent(), path.file_name().and_then(|n| n.to_str())) {
        (Some(dir), Some(name)) => Ok((dir, name.to_string())),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a file path", path.display()),
        )),
    }
}

impl Node {
    /// Opens the host root.
    pub fn open(root: &Path) -> Result<Self, NodeError> {
        Root::open(root)
            .map(|root| Self { root })
            .map_err(|e| NodeError::new(format!("cannot open the host root {}", root.display()), e))
    }

    /// The directory at a node path, when it is there (checked on the way).
    pub fn dir(&self, path: &Path) -> Result<Option<Dir>, NodeError> {
        self.root
            .find_dir(path)
            .map_err(|e| NodeError::new(format!("cannot open {} on the node", path.display()), e))
    }

    /// What is at a node path (`Missing` when its directory is missing too).
    pub fn entry(&self, path: &Path) -> Result<Entry, NodeError> {
        let (dir, name) = split(path).map_err(|e| NodeError::new("a bad path", e))?;
        match self.dir(dir)? {
            None => Ok(Entry::Missing),
            Some(d) => d.entry(&name).map_err(|e| {
                NodeError::new(format!("cannot look at {} on the node", path.display()), e)
            }),
        }
    }

    /// The regular file at a node path, never through a link; `None` when missing.
    pub fn read(&self, path: &Path) -> Result<Option<Vec<u8>>, NodeError> {
        let (dir, name) = split(path).map_err(|e| NodeError::new("a bad path", e))?;
        let Some(d) = self.dir(dir)? else {
            return Ok(None);
        };
        d.read_file(&name, MAX_FILE_BYTES)
            .map_err(|e| NodeError::new(format!("cannot read {} on the node", path.display()), e))
    }

    /// The directory at a node path, made when missing (with its parents, 0755).
    pub fn make_dir(&self, path: &Path) -> Result<(Dir, Vec<PathBuf>), NodeError> {
        self.root
            .make_dir(path, 0o755)
            .map_err(|e| NodeError::new(format!("cannot make {} on the node", path.display()), e))
    }

    /// Removes the empty directories `made` (node paths), deepest first; one not empty or
    /// gone stays as it is.
    pub fn remove_dirs(&self, made: &[PathBuf]) -> Vec<String> {
        let mut sorted: Vec<&PathBuf> = made.iter().collect();
        sorted.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        let mut failed = Vec::new();
        for p in sorted {
            let Ok((dir, name)) = split(p) else { continue };
            match self.dir(dir) {
                Ok(Some(d)) => {
                    if let Err(e) = d.remove_dir(&name) {
                        failed.push(format!("{}: {e}", p.display()));
                    }
                }
                Ok(None) => {}
                Err(e) => failed.push(e.line()),
            }
        }
        failed
    }

    /// Applies `changes` in their order, all or nothing; `record` is the node path of the file
    /// listing the directories the installer made (read, extended, written with the rest).
    pub fn apply(&self, changes: &[Change], record: &Path) -> Result<Applied<'_>, NodeError> {
        let mut applied = Applied {
            node: self,
            dirs: Vec::new(),
            made: Vec::new(),
            done: Vec::new(),
            changed: Vec::new(),
        };
        match applied.run(changes, record) {
            Ok(()) => Ok(applied),
            Err(e) => {
                applied.undo();
                Err(e)
            }
        }
    }
}

/// One committed file, to undo.
#[derive(Debug)]
struct Done {
    dir: usize,
    name: String,
    /// The old file, linked aside; `None` when there was none.
    aside: Option<String>,
}

/// The files an install changed, kept or undone.
#[derive(Debug)]
pub struct Applied<'a> {
    node: &'a Node,
    dirs: Vec<(PathBuf, Dir)>,
    made: Vec<PathBuf>,
    done: Vec<Done>,
    changed: Vec<PathBuf>,
}

impl Applied<'_> {
    /// The node paths whose files changed.
    pub fn changed(&self) -> &[PathBuf] {
        &self.changed
    }

    fn dir_of(&mut self, path: &Path) -> Result<usize, NodeError> {
        if let Some(i) = self.dirs.iter().position(|(p, _)| p == path) {
            return Ok(i);
        }
        let (d, made) = self.node.make_dir(path)?;
        self.made.extend(made);
        self.dirs.push((path.to_path_buf(), d));
        Ok(self.dirs.len() - 1)
    }

    fn run(&mut self, changes: &[Change], record: &Path) -> Result<(), NodeError> {
        // Every directory first, so the record knows what was made.
        let mut all = changes.to_vec();
        for c in &all {
            let (dir, _) = split(&c.path).map_err(|e| NodeError::new("a bad path", e))?;
            self.dir_of(dir)?;
        }
        let (record_dir, record_name) =
            split(record).map_err(|e| NodeError::new("a bad path", e))?;
        let rd = self.dir_of(record_dir)?;
        let mut listed = self.dirs[rd]
            .1
            .read_file(&record_name, 1 << 20)
            .map_err(|e| NodeError::new(format!("cannot read {}", record.display()), e))?
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default();
        for m in &self.made {
            let line = m.display().to_string();
            if !listed.lines().any(|l| l == line) {
                listed.push_str(&line);
                listed.push('\n');
            }
        }
        all.push(Change {
            path: record.to_path_buf(),
            want: Want::File {
                bytes: listed.into_bytes(),
                mode: 0o644,
            },
        });

        // Stage what differs; nothing visible changes yet.
        let mut staged: Vec<(usize, String, Staged, PathBuf)> = Vec::new();
        let result = (|| {
            for c in &all {
                let (dir, name) = split(&c.path).map_err(|e| NodeError::new("a bad path", e))?;
                let i = self.dir_of(dir)?;
                let d = &self.dirs[i].1;
                let at =
                    |e| NodeError::new(format!("cannot write {} on the node", c.path.display()), e);
                let now = d.entry(&name).map_err(at)?;
                let same = match (&now, &c.want) {
                    (Entry::File { mode, .. }, Want::File { bytes, mode: want })
                        if mode == want =>
                    {
                        d.read_file(&name, MAX_FILE_BYTES).map_err(at)?.as_deref()
                            == Some(bytes.as_slice())
                    }
                    (Entry::Symlink(t), Want::Link(want)) => t == want,
                    (Entry::Directory | Entry::Other, _) => {
                        return Err(NodeError::new(
                            format!("cannot write {} on the node", c.path.display()),
                            io::Error::new(
                                io::ErrorKind::AlreadyExists,
                                "something other than a file is there; it is not replaced",
                            ),
                        ))
                    }
                    _ => false,
                };
                if same {
                    continue;
                }
                let s = match &c.want {
                    Want::File { bytes, mode } => d.stage(&name, bytes, *mode),
                    Want::Link(target) => d.stage_symlink(&name, target),
                }
                .map_err(at)?;
                staged.push((i, name, s, c.path.clone()));
            }
            Ok(())
        })();
        if let Err(e) = result {
            for (i, _, s, _) in staged {
                self.dirs[i].1.discard(s);
            }
            return Err(e);
        }

        // Renamed over, in order; the record last but one would do, but last is simplest.
        let mut rest = staged.into_iter();
        while let Some((i, name, s, path)) = rest.next() {
            let aside = format!(".{name}.kata-topo-old");
            let d = &self.dirs[i].1;
            let at =
                |e| NodeError::new(format!("cannot replace {} on the node", path.display()), e);
            let kept = match d.keep(&name, &aside) {
                Ok(k) => k,
                Err(e) => {
                    d.discard(s);
                    for (j, _, s, _) in rest {
                        self.dirs[j].1.discard(s);
                    }
                    return Err(at(e));
                }
            };
            if let Err(e) = d.commit(s, &name) {
                if kept {
                    let _ = d.remove(&aside);
                }
                for (j, _, s, _) in rest {
                    self.dirs[j].1.discard(s);
                }
                return Err(at(e));
            }
            self.done.push(Done {
                dir: i,
                name,
                aside: kept.then_some(aside),
            });
            if path != record {
                self.changed.push(path);
            }
        }
        Ok(())
    }

    /// Puts every old file back, removes the new ones and the directories made.
    pub fn undo(&mut self) {
        for d in self.done.drain(..).rev() {
            let dir = &self.dirs[d.dir].1;
            match &d.aside {
                Some(aside) => {
                    let _ = dir.restore(aside, &d.name);
                }
                None => {
                    let _ = dir.remove(&d.name);
                    let _ = dir.sync();
                }
            }
        }
        self.changed.clear();
        self.dirs.clear();
        let made = std::mem::take(&mut self.made);
        self.node.remove_dirs(&made);
    }

    /// Keeps the new files: the old ones linked aside go.
    pub fn keep(mut self) {
        for d in self.done.drain(..) {
            if let Some(aside) = &d.aside {
                let _ = self.dirs[d.dir].1.remove(aside);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(path: &str, text: &str) -> Change {
        Change {
            path: PathBuf::from(path),
            want: Want::File {
                bytes: text.as_bytes().to_vec(),
                mode: 0o644,
            },
        }
    }

    fn tree(root: &Path) -> Vec<String> {
        let mut out = Vec::new();
        fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).expect("list").flatten() {
                let p = e.path();
                let rel = p.strip_prefix(root).expect("under").display().to_string();
                let m = std::fs::symlink_metadata(&p).expect("meta");
                if m.is_dir() {
                    out.push(format!("{rel}/"));
                    walk(root, &p, out);
                } else if m.is_symlink() {
                    out.push(format!(
                        "{rel} -> {}",
                        std::fs::read_link(&p).expect("l").display()
                    ));
                } else {
                    out.push(format!(
                        "{rel} {}",
                        String::from_utf8_lossy(&std::fs::read(&p).expect("r"))
                    ));
                }
            }
        }
        walk(root, root, &mut out);
        out.sort();
        out
    }

    fn node() -> (tempfile::TempDir, Node) {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        std::fs::create_dir_all(tmp.path().join("etc/conf.d")).expect("etc");
        let node = Node::open(tmp.path()).expect("node");
        (tmp, node)
    }

    #[test]
    fn all_files_or_none_and_an_undo_restores_the_old() {
        let (tmp, node) = node();
        std::fs::write(tmp.path().join("etc/conf.d/a.toml"), "old").expect("old");
        let before = tree(tmp.path());
        let record = Path::new("/opt/kt/share/created-dirs");
        // The second file cannot be written (a directory is at its name): nothing changes.
        std::fs::create_dir(tmp.path().join("etc/conf.d/b.toml")).expect("dir");
        let e = node
            .apply(
                &[
                    file("/opt/kt/bin/x", "new x"),
                    file("/etc/conf.d/b.toml", "b"),
                ],
                record,
            )
            .expect_err("a directory in the way");
        assert!(e.line().contains("/etc/conf.d/b.toml"), "{}", e.line());
        std::fs::remove_dir(tmp.path().join("etc/conf.d/b.toml")).expect("rmdir");
        assert_eq!(tree(tmp.path()), before);

        let mut applied = node
            .apply(
                &[
                    file("/opt/kt/bin/x", "new x"),
                    file("/etc/conf.d/a.toml", "new a"),
                ],
                record,
            )
            .expect("apply");
        assert_eq!(
            applied.changed(),
            [
                PathBuf::from("/opt/kt/bin/x"),
                PathBuf::from("/etc/conf.d/a.toml")
            ]
        );
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("opt/kt/share/created-dirs")).expect("record"),
            "/opt\n/opt/kt\n/opt/kt/bin\n/opt/kt/share\n"
        );
        applied.undo();
        assert_eq!(tree(tmp.path()), before);

        let applied = node
            .apply(&[file("/opt/kt/bin/x", "new x")], record)
            .expect("apply");
        applied.keep();
        let after = tree(tmp.path());
        let again = node
            .apply(&[file("/opt/kt/bin/x", "new x")], record)
            .expect("apply");
        assert!(
            again.changed().is_empty(),
            "the same content changes nothing"
        );
        again.keep();
        assert_eq!(tree(tmp.path()), after);
    }
}
