//! `GetPreferredAllocation`: which of the available devices the kubelet should give a
//! container, NUMA-aware. The Topology Manager already narrows the choice to the admitted node
//! under `single-numa-node` and `restricted`; under `best-effort` and `none` this keeps a
//! container's devices on as few NUMA nodes as it can.
//!
//! The devices that must be included come first. The rest are taken node by node: first the
//! nodes the must-include devices are on, then a node that can give every remaining device by
//! itself — the one with the fewest free, so larger nodes stay whole for larger requests — then
//! the others, the fullest first, and devices with no known node last.

use std::collections::BTreeMap;

/// Picks `size` ids: all of `must_include`, then from `available`, packed by NUMA node
/// (`node_of`; `None` when unknown). Returns fewer when there are not enough, never an id
/// twice, and only ids from the two lists.
pub fn preferred(
    available: &[String],
    must_include: &[String],
    size: usize,
    node_of: impl Fn(&str) -> Option<u32>,
) -> Vec<String> {
    let mut chosen: Vec<String> = Vec::new();
    for id in must_include {
        if !chosen.contains(id) {
            chosen.push(id.clone());
        }
    }
    if chosen.len() >= size {
        return chosen;
    }
    let need = size - chosen.len();
    let home: Vec<Option<u32>> = chosen.iter().map(|id| node_of(id)).collect();
    let mut by_node: BTreeMap<Option<u32>, Vec<&String>> = BTreeMap::new();
    let mut seen: Vec<&String> = Vec::new();
    let mut sorted: Vec<&String> = available.iter().collect();
    sorted.sort();
    for id in sorted {
        if chosen.contains(id) || seen.contains(&id) {
            continue;
        }
        seen.push(id);
        by_node.entry(node_of(id)).or_default().push(id);
    }
    let mut order: Vec<(Option<u32>, Vec<&String>)> = by_node.into_iter().collect();
    order.sort_by_key(|(node, ids)| {
        let known = node.is_some();
        let at_home = node.is_some() && home.contains(node);
        let fits = ids.len() >= need;
        // Best fit among the nodes that can give everything; the fullest among the rest.
        let size_key = if fits {
            ids.len()
        } else {
            usize::MAX - ids.len()
        };
        (!known, !at_home, !fits, size_key, *node)
    });
    for (_, ids) in order {
        for id in ids {
            if chosen.len() >= size {
                return chosen;
            }
            chosen.push(id.clone());
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// a0, a1 on node 0; b0, b1, b2 on node 1; u0 nowhere known.
    fn node_of(id: &str) -> Option<u32> {
        match id.as_bytes().first() {
            Some(b'a') => Some(0),
            Some(b'b') => Some(1),
            _ => None,
        }
    }

    fn pick(available: &[&str], must: &[&str], size: usize) -> Vec<String> {
        preferred(&ids(available), &ids(must), size, node_of)
    }

    const ALL: &[&str] = &["u0", "b2", "a1", "b0", "a0", "b1"];

    #[test]
    fn one_node_when_one_node_can_give_everything_the_smallest_that_can() {
        assert_eq!(pick(ALL, &[], 1), ids(&["a0"]));
        assert_eq!(pick(ALL, &[], 2), ids(&["a0", "a1"]));
        assert_eq!(pick(ALL, &[], 3), ids(&["b0", "b1", "b2"]));
    }

    #[test]
    fn the_fullest_node_first_when_none_can_and_unknown_nodes_last() {
        assert_eq!(pick(ALL, &[], 4), ids(&["b0", "b1", "b2", "a0"]));
        assert_eq!(
            pick(ALL, &[], 6),
            ids(&["b0", "b1", "b2", "a0", "a1", "u0"])
        );
        assert_eq!(pick(ALL, &[], 9).len(), 6);
    }

    #[test]
    fn must_include_comes_first_and_pulls_the_rest_to_its_node() {
        assert_eq!(pick(ALL, &["a1"], 2), ids(&["a1", "a0"]));
        assert_eq!(pick(ALL, &["b1"], 2), ids(&["b1", "b0"]));
        assert_eq!(pick(ALL, &["u0"], 2), ids(&["u0", "a0"]));
        assert_eq!(pick(ALL, &["b1", "a0"], 1), ids(&["b1", "a0"]));
    }

    #[test]
    fn no_duplicates_and_nothing_from_outside_the_lists() {
        let got = pick(&["a0", "a0", "b0"], &["a0", "a0"], 3);
        assert_eq!(got, ids(&["a0", "b0"]));
        assert!(pick(&[], &[], 2).is_empty());
        assert!(pick(ALL, &[], 0).is_empty());
    }
}
