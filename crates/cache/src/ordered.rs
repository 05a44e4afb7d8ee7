//! A totally ordered `f64` for use inside ordered collections.

use std::cmp::Ordering;

/// An `f64` ordered by [`f64::total_cmp`], so that it can be part of a
/// `BTreeMap` key.
///
/// Written by hand because the ordering needed here is a one-liner; the
/// policies never store NaN (scores are sums and products of finite,
/// non-negative numbers), and `total_cmp` keeps the ordering total even if
/// one slipped through.
#[derive(Clone, Copy, Debug)]
pub(crate) struct OrdF64(pub(crate) f64);

impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for OrdF64 {}

impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[cfg(test)]
mod tests {
    use super::OrdF64;
    use std::collections::BTreeSet;

    #[test]
    fn orders_like_numbers() {
        let set: BTreeSet<OrdF64> = [3.5, 0.0, 1e-300, 2.0, 1e300]
            .into_iter()
            .map(OrdF64)
            .collect();
        let back: Vec<f64> = set.into_iter().map(|x| x.0).collect();
        assert_eq!(back, vec![0.0, 1e-300, 2.0, 3.5, 1e300]);
    }
}
