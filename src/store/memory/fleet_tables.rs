//! The memory store's fleet tables beside its buckets, as the Redis scripts keep
//! them: RLQS streams' demands (`lua/fair_share.lua`), concurrency limits'
//! slots per member (`lua/slots.lua`) and the overrides
//! (`lua/overrides.lua`). The fleet is this instance.

use std::collections::HashMap;

use super::{MemberEntry, MemoryStore};
use crate::sync::Recover as _;

/// Whether `key` has a place in a table of at most `max_keys` keys whose
/// entries are (member, value, expires at): it has one, or there is room,
/// or there is once the expired entries (and the keys left empty) go.
fn room_for(all: &mut HashMap<String, Vec<MemberEntry>>, key: &str, max_keys: usize, now: u64) -> bool {
    if all.len() < max_keys || all.contains_key(key) {
        return true;
    }
    all.retain(|_, v| {
        v.retain(|(_, _, expires)| *expires > now);
        !v.is_empty()
    });
    all.len() < max_keys
}

impl MemoryStore {
    /// Records a stream's demand and answers its max-min fair share, or
    /// deletes it when the stream leaves, as `lua/fair_share.lua` does on
    /// Redis.
    pub(crate) fn fair_share_now(&self, d: crate::store::Demand<'_>) -> u64 {
        let now = (self.clock)();
        let mut all = self.demands.lock().recover();
        if d.leaves() {
            if let Some(streams) = all.get_mut(d.key) {
                streams.retain(|(member, _, expires)| *member != d.member && *expires > now);
                if streams.is_empty() {
                    all.remove(d.key);
                }
            }
            return 0;
        }
        if !room_for(&mut all, d.key, self.max_keys, now) {
            return d.rate; // no room to share: the rate bounds it
        }
        let streams = all.entry(d.key.to_string()).or_default();
        streams.retain(|(member, _, expires)| *member != d.member && *expires > now);
        let others: Vec<f64> = streams.iter().map(|(_, demand, _)| *demand as f64).collect();
        streams.push((d.member, d.demand, now.saturating_add(d.ttl_ms)));
        crate::quota::fair::max_min_share(d.demand as f64, &others, d.rate as f64) as u64
    }

    /// Sets a member's slots and grants what fits, as `lua/slots.lua` does
    /// on Redis. A new key finds no room when `max_keys` keys hold slots
    /// (none is forgotten while held: that would let more in than the
    /// limit): it is granted nothing.
    pub fn hold_slots_now(&self, h: crate::store::Hold<'_>) -> crate::store::Slots {
        let now = (self.clock)();
        let mut all = self.slots.lock().recover();
        if !room_for(&mut all, h.key, self.max_keys, now) {
            return crate::store::Slots::default();
        }
        let members = all.entry(h.key.to_string()).or_default();
        members.retain(|(member, _, expires)| *member != h.member && *expires > now);
        let others: u64 = members.iter().map(|(_, n, _)| n).sum();
        let granted = h.want.min(h.max.saturating_sub(others).saturating_sub(h.hold));
        let held = h.hold + granted;
        if held > 0 {
            members.push((h.member, held, now.saturating_add(h.ttl_ms)));
        } else if members.is_empty() {
            all.remove(h.key);
        }
        crate::store::Slots {
            granted,
            held: others + held,
        }
    }

    /// The overrides call, as `lua/overrides.lua` answers it.
    pub fn overrides_now(&self, op: crate::store::OverrideOp<'_>) -> crate::store::Overridden {
        use crate::store::OverrideOp;
        let mut o = self.overrides.lock().recover();
        let (version, table) = &mut *o;
        match op {
            OverrideOp::Set { limit, who, value } => {
                let entry = (limit.to_string(), who.to_string());
                let held = table.keys().filter(|(l, _)| l == limit).count() as u64;
                if !table.contains_key(&entry) && held >= crate::store::MAX_OVERRIDES_PER_LIMIT {
                    return crate::store::Overridden {
                        full: true,
                        ..Default::default()
                    };
                }
                table.insert(entry, value.to_string());
                *version += 1;
            }
            OverrideOp::Delete { limit, who } => {
                // Nothing deleted: no new version.
                if table.remove(&(limit.to_string(), who.to_string())).is_some() {
                    *version += 1;
                }
            }
            OverrideOp::Version => {}
            OverrideOp::Load(limits) => {
                return crate::store::Overridden {
                    version: *version,
                    entries: table
                        .iter()
                        .filter(|((l, _), _)| limits.contains(l))
                        .map(|((l, w), v)| (l.clone(), w.clone(), v.clone()))
                        .collect(),
                    full: false,
                }
            }
        }
        crate::store::Overridden {
            version: *version,
            ..Default::default()
        }
    }
}
