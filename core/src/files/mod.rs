//! Every file kata-topo reads or writes goes through here.
//!
//! - Reading ([`read_bounded`] and its variants): opened without blocking, refused unless a
//!   regular file, read up to a limit — see the `read` module's notes.
//! - Writing in a directory another user may write too ([`Dir`], [`write_atomic`]): the
//!   directory opened once without following a symlink, every file replaced by an atomic
//!   rename relative to it — see the `dir` module's notes.
//! - Writing another system's files under a root (the node's `/` in the installer's
//!   container: [`Root`]): every directory reached without following a link and checked,
//!   every file staged, `fsync`ed and renamed, undoable — see the `tree` module's notes.

mod dir;
mod read;
mod tree;

pub use dir::{identity, is_untrusted, write_atomic, Dir, Untrusted};
pub use read::{
    open_regular, read_bounded, read_bounded_nofollow, read_text_bounded,
    read_text_bounded_nofollow, read_to_limit, Symlinks,
};
pub use tree::{components, Entry, Root, Staged};
