//! Key ranges: how the key space is divided among servers (and among a server's shards).
//!
//! The whole `u64` key space is cut into `n` contiguous ranges of (almost) equal size, as in
//! ps-lite, but with inclusive ends so that key `u64::MAX` belongs to the last range and no
//! arithmetic overflows. Requests carry keys sorted ascending, each once; [`slice_sorted_keys`]
//! checks that and finds each range's part of a request with binary searches, so the parts
//! are contiguous and can be sliced out of the request's buffers without copying.

use std::ops::Range;

/// A contiguous, inclusive range of keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyRange {
    /// First key of the range.
    pub first: u64,
    /// Last key of the range (inclusive).
    pub last: u64,
}

impl KeyRange {
    /// The whole key space.
    pub const ALL: KeyRange = KeyRange {
        first: 0,
        last: u64::MAX,
    };

    /// Whether `key` is in the range.
    pub fn contains(&self, key: u64) -> bool {
        self.first <= key && key <= self.last
    }

    /// Cuts this range into `n` contiguous parts of (almost) equal size; `n` of 0 is taken as 1.
    ///
    /// ```
    /// use ps::range::KeyRange;
    /// let parts = KeyRange::ALL.split(3);
    /// assert_eq!(parts[0].first, 0);
    /// assert_eq!(parts[2].last, u64::MAX);
    /// assert_eq!(parts[0].last + 1, parts[1].first);
    /// ```
    pub fn split(&self, n: usize) -> Vec<KeyRange> {
        let n = n.max(1) as u128;
        let size = u128::from(self.last - self.first) + 1;
        let n = n.min(size);
        let start = u128::from(self.first);
        (0..n)
            .map(|i| KeyRange {
                first: (start + size * i / n) as u64,
                last: (start + size * (i + 1) / n - 1) as u64,
            })
            .collect()
    }
}

/// The key range of each of `num_servers` servers, by server rank.
pub fn server_key_ranges(num_servers: usize) -> Vec<KeyRange> {
    KeyRange::ALL.split(num_servers)
}

/// Index ranges of keys, one per key range (inline up to four: no allocation per request on
/// clusters of up to four servers or shards).
pub type Slices = van_core::smallvec::SmallVec<[Range<usize>; 4]>;

/// For keys sorted ascending, each once, the index range of the keys that fall in each of
/// `ranges` (which must be sorted and disjoint). Keys in no range are in no slice.
///
/// Fails naming the first key out of order, or the first key given twice: a request with a
/// duplicate key would sum its values twice on a push and answer them twice on a pull.
///
/// ```
/// use ps::range::{server_key_ranges, slice_sorted_keys};
/// let ranges = server_key_ranges(2);
/// assert!(slice_sorted_keys(&[1, 2, u64::MAX], &ranges).is_ok());
/// let twice = slice_sorted_keys(&[1, 7, 7], &ranges).unwrap_err();
/// assert_eq!(twice.to_string(), "key 7 is given twice (at positions 1 and 2); each key once");
/// ```
pub fn slice_sorted_keys(keys: &[u64], ranges: &[KeyRange]) -> Result<Slices, KeyOrderError> {
    if let Some(i) = keys.windows(2).position(|w| w[0] >= w[1]) {
        let (before, key) = (keys[i], keys[i + 1]);
        return Err(if before == key {
            KeyOrderError::Duplicate { key, at: i }
        } else {
            KeyOrderError::Unsorted {
                key,
                before,
                at: i + 1,
            }
        });
    }
    Ok(ranges
        .iter()
        .map(|r| {
            let begin = keys.partition_point(|k| *k < r.first);
            let end = keys.partition_point(|k| *k <= r.last);
            begin..end.max(begin)
        })
        .collect())
}

/// Why the keys of a request are refused: they must be sorted ascending, each once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyOrderError {
    /// A key smaller than the one before it.
    #[error("keys must be sorted in ascending order: key {key} at position {at} follows {before}")]
    Unsorted {
        /// The key out of order.
        key: u64,
        /// The key before it.
        before: u64,
        /// Its position in the request.
        at: usize,
    },
    /// A key given twice in a row.
    #[error("key {key} is given twice (at positions {at} and {}); each key once", at + 1)]
    Duplicate {
        /// The key.
        key: u64,
        /// The position of its first occurrence.
        at: usize,
    },
}

/// The index of the range in `ranges` (sorted, covering the keys) holding `key`.
pub fn range_of(key: u64, ranges: &[KeyRange]) -> Option<usize> {
    let i = ranges.partition_point(|r| r.last < key);
    ranges.get(i).filter(|r| r.contains(key)).map(|_| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ranges_cover_the_key_space_without_gaps_or_overflow() {
        for n in [1, 2, 3, 7, 64, 1000] {
            let ranges = server_key_ranges(n);
            assert_eq!(ranges.len(), n);
            assert_eq!(ranges[0].first, 0);
            assert_eq!(ranges[n - 1].last, u64::MAX);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].last + 1, pair[1].first, "gap or overlap");
            }
        }
        // A range smaller than the number of parts gives one key per part.
        let tiny = KeyRange { first: 5, last: 7 }.split(10);
        assert_eq!(tiny.len(), 3);
        assert!(tiny.iter().all(|r| r.first == r.last));
    }

    proptest! {
        #[test]
        fn every_key_lands_on_exactly_one_server(
            mut keys in proptest::collection::vec(any::<u64>(), 0..200),
            extremes in proptest::collection::vec(prop_oneof![Just(0u64), Just(u64::MAX)], 0..3),
            servers in 1usize..20,
        ) {
            keys.extend(extremes);
            keys.sort_unstable();
            keys.dedup();
            let ranges = server_key_ranges(servers);
            let slices = slice_sorted_keys(&keys, &ranges).unwrap();
            let mut union = Vec::new();
            for (server, slice) in slices.iter().enumerate() {
                for key in &keys[slice.clone()] {
                    prop_assert!(ranges[server].contains(*key));
                    prop_assert_eq!(range_of(*key, &ranges), Some(server));
                }
                union.extend_from_slice(&keys[slice.clone()]);
            }
            prop_assert_eq!(union, keys);
        }

        #[test]
        fn unsorted_or_repeated_keys_are_refused(
            keys in proptest::collection::vec(0u64..64, 2..50),
        ) {
            let ascending = keys.windows(2).all(|w| w[0] < w[1]);
            let result = slice_sorted_keys(&keys, &server_key_ranges(3));
            prop_assert_eq!(result.is_ok(), ascending);
            match result {
                Ok(_) => {}
                Err(KeyOrderError::Duplicate { key, at }) => {
                    prop_assert!(keys[at] == key && keys[at + 1] == key);
                    prop_assert!(keys[..=at].windows(2).all(|w| w[0] < w[1]));
                }
                Err(KeyOrderError::Unsorted { key, before, at }) => {
                    prop_assert!(keys[at] == key && keys[at - 1] == before && before > key);
                    prop_assert!(keys[..at].windows(2).all(|w| w[0] < w[1]));
                }
            }
        }
    }
}
