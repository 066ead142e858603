//! Sets of CPU or NUMA node ids in the Linux list syntax (`0-3,8`).
//!
//! This is the one parser for cpusets and node sets in kata-topo: OCI `cpus`/`mems`, the
//! `kata-topo.io/numa-nodes` annotation, sysfs `cpulist` files and baselines all go through it.
//! It is strict (no reversed ranges, no empty items, no stray characters) and bounded
//! ([`MAX_ID`], [`MAX_LEN`]) so hostile input costs nothing.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The largest id accepted. Linux's `CONFIG_NR_CPUS` tops out at 8192 and `MAX_NUMNODES` at
/// 1024; 16383 leaves room without letting `0-4294967295` allocate gigabytes.
pub const MAX_ID: u32 = 16_383;

/// The longest list accepted, in bytes (a 16384-CPU machine listed one by one fits).
pub const MAX_LEN: usize = 96 * 1024;

/// Why a list did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdSetError {
    /// The input is longer than [`MAX_LEN`].
    #[error("list is {0} bytes long, more than the {MAX_LEN} accepted")]
    TooLong(usize),
    /// Two commas with nothing between them, or a leading/trailing comma.
    #[error("empty item at position {0}")]
    EmptyItem(usize),
    /// An item that is not a number or a range of numbers.
    #[error("`{0}` is not an id or a range of ids")]
    NotANumber(String),
    /// A range whose end is below its start.
    #[error("range `{0}` is reversed")]
    Reversed(String),
    /// An id above [`MAX_ID`].
    #[error("id {0} is beyond the maximum of {MAX_ID}")]
    TooLarge(String),
}

/// A set of small non-negative ids (CPUs or NUMA nodes), kept as a bitmap.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct IdSet {
    /// Bit `i % 64` of word `i / 64` is id `i`; no trailing zero words.
    words: Vec<u64>,
}

impl IdSet {
    /// The empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Parses the Linux list syntax. Surrounding white space (a sysfs file's newline) is
    /// ignored; an empty string is the empty set.
    pub fn parse(input: &str) -> Result<Self, IdSetError> {
        if input.len() > MAX_LEN {
            return Err(IdSetError::TooLong(input.len()));
        }
        let input = input.trim();
        let mut set = Self::new();
        if input.is_empty() {
            return Ok(set);
        }
        for (pos, item) in input.split(',').enumerate() {
            if item.is_empty() {
                return Err(IdSetError::EmptyItem(pos));
            }
            let (lo, hi) = match item.split_once('-') {
                Some((a, b)) => (parse_id(a, item)?, parse_id(b, item)?),
                None => {
                    let id = parse_id(item, item)?;
                    (id, id)
                }
            };
            if hi < lo {
                return Err(IdSetError::Reversed(item.to_string()));
            }
            set.insert_range(lo, hi);
        }
        Ok(set)
    }

    /// Adds one id. Ids above [`MAX_ID`] are a programming error on the caller's side and are
    /// ignored rather than allocating without bound.
    pub fn insert(&mut self, id: u32) {
        if id > MAX_ID {
            return;
        }
        let (w, b) = ((id / 64) as usize, id % 64);
        if self.words.len() <= w {
            self.words.resize(w + 1, 0);
        }
        self.words[w] |= 1 << b;
    }

    fn insert_range(&mut self, lo: u32, hi: u32) {
        for id in lo..=hi {
            self.insert(id);
        }
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: u32) -> bool {
        let (w, b) = ((id / 64) as usize, id % 64);
        self.words.get(w).is_some_and(|word| word & (1 << b) != 0)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// How many ids the set holds.
    pub fn len(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The ids in ascending order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(i, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                if rest == 0 {
                    return None;
                }
                let bit = rest.trailing_zeros();
                rest &= rest - 1;
                Some(i as u32 * 64 + bit)
            })
        })
    }

    /// The smallest id, if any.
    pub fn first(&self) -> Option<u32> {
        self.iter().next()
    }

    /// `self ∪ other`.
    pub fn union(&self, other: &Self) -> Self {
        let (long, short) = if self.words.len() >= other.words.len() {
            (self, other)
        } else {
            (other, self)
        };
        let mut words = long.words.clone();
        for (w, o) in words.iter_mut().zip(&short.words) {
            *w |= o;
        }
        Self { words }
    }

    /// `self ∩ other`.
    pub fn intersection(&self, other: &Self) -> Self {
        let words = self
            .words
            .iter()
            .zip(&other.words)
            .map(|(a, b)| a & b)
            .collect();
        Self::trimmed(words)
    }

    /// `self \ other`.
    pub fn difference(&self, other: &Self) -> Self {
        let words = self
            .words
            .iter()
            .enumerate()
            .map(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0))
            .collect();
        Self::trimmed(words)
    }

    /// Whether every id of `self` is in `other`.
    pub fn is_subset(&self, other: &Self) -> bool {
        self.words
            .iter()
            .enumerate()
            .all(|(i, a)| a & !other.words.get(i).copied().unwrap_or(0) == 0)
    }

    /// Whether the two sets share an id.
    pub fn intersects(&self, other: &Self) -> bool {
        self.words.iter().zip(&other.words).any(|(a, b)| a & b != 0)
    }

    fn trimmed(mut words: Vec<u64>) -> Self {
        while words.last() == Some(&0) {
            words.pop();
        }
        Self { words }
    }

    /// The ids as a vector, for JSON arrays.
    pub fn to_vec(&self) -> Vec<u32> {
        self.iter().collect()
    }
}

fn parse_id(text: &str, item: &str) -> Result<u32, IdSetError> {
    if text.is_empty() || text.len() > 10 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(IdSetError::NotANumber(item.to_string()));
    }
    let value: u64 = text
        .parse()
        .map_err(|_| IdSetError::NotANumber(item.to_string()))?;
    if value > u64::from(MAX_ID) {
        return Err(IdSetError::TooLarge(text.to_string()));
    }
    Ok(value as u32)
}

impl FromIterator<u32> for IdSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> Self {
        let mut set = Self::new();
        for id in iter {
            set.insert(id);
        }
        set
    }
}

impl FromStr for IdSet {
    type Err = IdSetError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

/// The Linux list syntax, ranges collapsed: `0-3,8`.
impl fmt::Display for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut ids = self.iter().peekable();
        while let Some(lo) = ids.next() {
            let mut hi = lo;
            while ids.peek() == Some(&(hi + 1)) {
                hi += 1;
                ids.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if hi == lo {
                write!(f, "{lo}")?;
            } else {
                write!(f, "{lo}-{hi}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for IdSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IdSet({self})")
    }
}

/// Serialised as the list string, so baselines and verdicts read like sysfs.
impl Serialize for IdSet {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for IdSet {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        Self::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn set(s: &str) -> IdSet {
        IdSet::parse(s).expect("valid list")
    }

    #[test]
    fn parses_and_formats_lists() {
        assert_eq!(set("0-3,8").to_vec(), vec![0, 1, 2, 3, 8]);
        assert_eq!(set("8,0-3").to_string(), "0-3,8");
        assert_eq!(set("0,2,4,6").to_string(), "0,2,4,6");
        assert_eq!(set("1,2,3").to_string(), "1-3");
        assert_eq!(set(" 0-1\n").to_string(), "0-1");
        assert!(set("").is_empty());
        assert_eq!(set("63-65").to_vec(), vec![63, 64, 65]);
        assert_eq!(set(&MAX_ID.to_string()).to_vec(), vec![MAX_ID]);
    }

    #[test]
    fn rejects_malformed_lists() {
        assert_eq!(IdSet::parse("3-1"), Err(IdSetError::Reversed("3-1".into())));
        assert_eq!(IdSet::parse("a"), Err(IdSetError::NotANumber("a".into())));
        assert_eq!(IdSet::parse("0,,1"), Err(IdSetError::EmptyItem(1)));
        assert_eq!(IdSet::parse("0,"), Err(IdSetError::EmptyItem(1)));
        assert_eq!(IdSet::parse(",0"), Err(IdSetError::EmptyItem(0)));
        assert!(matches!(IdSet::parse("-1"), Err(IdSetError::NotANumber(_))));
        assert!(matches!(IdSet::parse("1-"), Err(IdSetError::NotANumber(_))));
        assert!(matches!(
            IdSet::parse("0-2-4"),
            Err(IdSetError::NotANumber(_))
        ));
        assert!(matches!(
            IdSet::parse("0 ,1"),
            Err(IdSetError::NotANumber(_))
        ));
        assert!(matches!(IdSet::parse("+1"), Err(IdSetError::NotANumber(_))));
        assert!(matches!(
            IdSet::parse("0-7:2"),
            Err(IdSetError::NotANumber(_))
        ));
        assert!(matches!(
            IdSet::parse("16384"),
            Err(IdSetError::TooLarge(_))
        ));
        assert!(matches!(
            IdSet::parse("0-4294967295"),
            Err(IdSetError::TooLarge(_))
        ));
        assert!(matches!(
            IdSet::parse("99999999999999999999"),
            Err(IdSetError::NotANumber(_))
        ));
        let long = "1,".repeat(MAX_LEN);
        assert!(matches!(IdSet::parse(&long), Err(IdSetError::TooLong(_))));
    }

    #[test]
    fn set_algebra() {
        let a = set("0-7");
        let b = set("4-11,100");
        assert_eq!(a.union(&b).to_string(), "0-11,100");
        assert_eq!(a.intersection(&b).to_string(), "4-7");
        assert_eq!(a.difference(&b).to_string(), "0-3");
        assert_eq!(b.difference(&a).to_string(), "8-11,100");
        assert!(set("1-2").is_subset(&a));
        assert!(!b.is_subset(&a));
        assert!(IdSet::new().is_subset(&a));
        assert!(a.intersects(&b));
        assert!(!set("0").intersects(&set("100")));
        assert_eq!(b.len(), 9);
        assert_eq!(b.first(), Some(4));
        // Trimmed: an emptied high word does not make two equal sets differ.
        assert_eq!(set("0,100").difference(&set("100")), set("0"));
    }

    #[test]
    fn serde_uses_the_list_string() {
        let json = serde_json::to_string(&set("0-3,8")).expect("serialise");
        assert_eq!(json, "\"0-3,8\"");
        let back: IdSet = serde_json::from_str(&json).expect("deserialise");
        assert_eq!(back, set("0-3,8"));
        assert!(serde_json::from_str::<IdSet>("\"3-1\"").is_err());
    }

    /// One item of a generated list: an id or a range, valid or not.
    #[derive(Debug, Clone)]
    enum Item {
        Id(u64),
        Range(u64, u64),
    }

    fn item() -> impl Strategy<Value = Item> {
        // Mostly valid ids, some just past MAX_ID, some far beyond u32.
        let id = prop_oneof![
            8 => 0u64..=u64::from(MAX_ID),
            1 => u64::from(MAX_ID) + 1..=u64::from(MAX_ID) + 64,
            1 => 0u64..=99_999_999_999,
        ];
        prop_oneof![
            id.clone().prop_map(Item::Id),
            (id.clone(), id).prop_map(|(a, b)| Item::Range(a, b)),
            (0u64..=u64::from(MAX_ID), 0u64..=200)
                .prop_map(|(a, n)| Item::Range(a, (a + n).min(u64::from(MAX_ID)))),
        ]
    }

    /// What the parser must say about a list of items: the first invalid item's error, else
    /// the union of the items.
    fn model(items: &[Item]) -> Result<BTreeSet<u32>, IdSetError> {
        let mut ids = BTreeSet::new();
        let check = |v: u64, item: &str| {
            if v.to_string().len() > 10 {
                Err(IdSetError::NotANumber(item.to_string()))
            } else if v > u64::from(MAX_ID) {
                Err(IdSetError::TooLarge(v.to_string()))
            } else {
                Ok(v as u32)
            }
        };
        for it in items {
            let text = show(it);
            let (lo, hi) = match *it {
                Item::Id(v) => (check(v, &text)?, check(v, &text)?),
                Item::Range(a, b) => (check(a, &text)?, check(b, &text)?),
            };
            if hi < lo {
                return Err(IdSetError::Reversed(text));
            }
            ids.extend(lo..=hi);
        }
        Ok(ids)
    }

    fn show(it: &Item) -> String {
        match it {
            Item::Id(v) => v.to_string(),
            Item::Range(a, b) => format!("{a}-{b}"),
        }
    }

    fn as_model(set: &IdSet) -> BTreeSet<u32> {
        set.iter().collect()
    }

    fn small_set() -> impl Strategy<Value = BTreeSet<u32>> {
        proptest::collection::btree_set(prop_oneof![0u32..200, 0u32..=MAX_ID], 0..40)
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_text(s in "\\PC{0,64}") {
            let _ = IdSet::parse(&s);
        }

        #[test]
        fn never_panics_on_hostile_text_and_bytes(
            s in crate::testutil::hostile_text(300),
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            for text in [s, String::from_utf8_lossy(&bytes).into_owned()] {
                if let Ok(set) = IdSet::parse(&text) {
                    // Only digits, commas, dashes and surrounding white space parse.
                    prop_assert!(text.trim().bytes().all(|b| b.is_ascii_digit() || b == b',' || b == b'-'), "{:?}", text);
                    prop_assert!(set.iter().all(|id| id <= MAX_ID));
                }
            }
        }

        #[test]
        fn parses_generated_lists_as_the_model_says(
            items in proptest::collection::vec(item(), 0..12),
            pad in prop::sample::select(vec!["", " ", "\n", "\t ", " \r\n"]),
        ) {
            let text = format!(
                "{pad}{}{pad}",
                items.iter().map(show).collect::<Vec<_>>().join(",")
            );
            let parsed = IdSet::parse(&text).map(|s| as_model(&s));
            prop_assert_eq!(parsed, model(&items), "{:?}", text);
        }

        #[test]
        fn a_broken_item_is_never_accepted(
            before in proptest::collection::vec(0u32..100, 1..4),
            after in proptest::collection::vec(0u32..100, 1..4),
            junk in prop::sample::select(vec!["", " 1", "1 ", "a", "-", "1-", "-1", "1--2", "0x1", "+1", "1.0", "1-2-3", "\u{0}", "١", "1\n"]),
        ) {
            let join = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
            let text = format!("{},{junk},{}", join(&before), join(&after));
            prop_assert!(IdSet::parse(&text).is_err(), "{:?} parsed", text);
        }

        #[test]
        fn formatting_is_canonical(s in "[0-9,\\-]{0,40}") {
            if let Ok(set) = IdSet::parse(&s) {
                let shown = set.to_string();
                let again = IdSet::parse(&shown).expect("formatted list parses");
                prop_assert_eq!(again.to_string(), shown);
                prop_assert_eq!(again, set);
            }
        }

        #[test]
        fn set_algebra_matches_the_model(a in small_set(), b in small_set()) {
            let (x, y): (IdSet, IdSet) = (a.iter().copied().collect(), b.iter().copied().collect());
            prop_assert_eq!(as_model(&x.union(&y)), a.union(&b).copied().collect::<BTreeSet<_>>());
            prop_assert_eq!(as_model(&x.intersection(&y)), a.intersection(&b).copied().collect::<BTreeSet<_>>());
            prop_assert_eq!(as_model(&x.difference(&y)), a.difference(&b).copied().collect::<BTreeSet<_>>());
            prop_assert_eq!(x.is_subset(&y), a.is_subset(&b));
            prop_assert_eq!(x.intersects(&y), !a.is_disjoint(&b));
            prop_assert_eq!(x.len(), a.len());
            prop_assert_eq!(x.first(), a.first().copied());
            // Equal sets are equal values whatever they were built from.
            prop_assert_eq!(x.difference(&y).union(&x.intersection(&y)), x.clone());
            for id in a.iter().chain(&b) {
                prop_assert_eq!(x.contains(*id), a.contains(id));
            }
        }

        #[test]
        fn never_panics_on_list_like_text(s in "[0-9,\\- ]{0,40}") {
            if let Ok(parsed) = IdSet::parse(&s) {
                // Whatever parses formats back to something that parses to the same set.
                prop_assert_eq!(IdSet::parse(&parsed.to_string()), Ok(parsed));
            }
        }

        #[test]
        fn round_trips_arbitrary_sets(ids in proptest::collection::btree_set(0u32..=MAX_ID, 0..200)) {
            let set: IdSet = ids.iter().copied().collect();
            let text = set.to_string();
            let back = IdSet::parse(&text).expect("formatted list parses");
            prop_assert_eq!(&back, &set);
            prop_assert_eq!(back.to_vec(), ids.into_iter().collect::<Vec<_>>());
        }
    }
}
