//! The pod's node affinity against its node's labels, as the API server gave them for this
//! request ([`crate::input::affinity`]): `node-affinity-violated`, `node-labels-changed`,
//! `node-labels-unavailable`.

use crate::check::context::Context;
use crate::check::Findings;

pub(in crate::check) fn check(cx: &Context<'_>, f: &mut Findings) {
    if let Some(view) = cx.node {
        view.findings(&mut |rule, message, expected, observed| {
            f.add(rule, message, expected, observed)
        });
    }
}
