//! A limit as a request holds it: one pointer to the snapshot's
//! [`LimitRuntime`], which carries the compiled limit (`config`) and its
//! runtime (spec, stage, counters) together. A verdict, a reserve or a
//! queue ticket names its limit by handle, never by a position in a
//! table, so none of them can name a limit that is not there; the one
//! place positions (a route's compiled `limits`) become handles is the
//! snapshot that built the table ([`crate::runtime::Snapshot`]).

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use super::LimitRuntime;

/// A borrowed limit: as cheap to copy as an index, equal only to itself.
#[derive(Clone, Copy)]
pub struct LimitRef<'l>(&'l Arc<LimitRuntime>);

impl<'l> LimitRef<'l> {
    pub fn new(limit: &'l Arc<LimitRuntime>) -> LimitRef<'l> {
        LimitRef(limit)
    }

    /// The limit, for as long as the handle's table lives.
    pub fn get(self) -> &'l LimitRuntime {
        self.0
    }

    /// The limit, owned: for what outlives the request's borrow of the
    /// snapshot (a response body's watch, the access log's record).
    pub fn to_arc(self) -> Arc<LimitRuntime> {
        Arc::clone(self.0)
    }

    /// Whether `other` is this very limit (not one configured alike).
    pub fn is(self, other: &Arc<LimitRuntime>) -> bool {
        Arc::ptr_eq(self.0, other)
    }
}

impl<'l> From<&'l Arc<LimitRuntime>> for LimitRef<'l> {
    fn from(limit: &'l Arc<LimitRuntime>) -> LimitRef<'l> {
        LimitRef(limit)
    }
}

impl Deref for LimitRef<'_> {
    type Target = LimitRuntime;

    fn deref(&self) -> &LimitRuntime {
        self.0
    }
}

impl PartialEq for LimitRef<'_> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(self.0, other.0)
    }
}

impl Eq for LimitRef<'_> {}

impl fmt::Debug for LimitRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LimitRef").field(&self.0.config.name).finish()
    }
}

/// The limits `ids` names in `table`, as handles: the one place a
/// compiled position (a route's `limits`, a usage route's) is resolved,
/// by the snapshot that built `table` from the same config, so every id
/// is in it.
pub fn resolve<'l>(table: &'l [Arc<LimitRuntime>], ids: &'l [usize]) -> impl Iterator<Item = LimitRef<'l>> + 'l {
    ids.iter().filter_map(|&i| table.get(i)).map(LimitRef)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::policy::{Draft, Limit};
    use crate::telemetry::metrics::Metrics;

    fn limit(name: &str) -> Arc<LimitRuntime> {
        let config = Arc::new(Limit::try_new(Draft::new(name, "1/s".parse().unwrap())).unwrap());
        Arc::new(LimitRuntime::new(config, "test", &Metrics::new()))
    }

    #[test]
    fn a_handle_is_equal_only_to_its_own_limit() {
        let (a, b) = (vec![limit("a")], vec![limit("a")]);
        assert_eq!(LimitRef::new(&a[0]), LimitRef::new(&a[0]));
        assert_ne!(LimitRef::new(&a[0]), LimitRef::new(&b[0]), "alike, not the same");
        assert!(LimitRef::new(&a[0]).is(&a[0]) && !LimitRef::new(&a[0]).is(&b[0]));
        assert_eq!(format!("{:?}", LimitRef::new(&a[0])), "LimitRef(\"a\")");
        let ids = [0, 7];
        assert_eq!(resolve(&a, &ids).count(), 1, "an id past the table names nothing");
    }
}
