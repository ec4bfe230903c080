//! The region link's wire format (`region::wire`): a transfer request body
//! as the primary receives it, and the store keys it accepts.
//!
//! Properties: nothing panics; `key_limit` names a non-empty limit made of
//! `[A-Za-z0-9_.-]` taken from right after `rl:{`; a request that parses has
//! a rate-limit key and a window in range, its quota slices (at a share
//! taken from the input) to no more than the whole and at least 1, and it
//! survives a round trip: serialised again it parses to itself, and
//! `TransferRequest::new` from its own quota rebuilds it. The answer type
//! never panics either.
#![no_main]

use leasegate::quota::Share;
use leasegate::region::wire::{key_limit, TransferAnswer, TransferRequest, MAX_WINDOW_MS};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Some(limit) = key_limit(text) {
            assert!(!limit.is_empty());
            assert!(limit
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)));
            assert!(text.starts_with(&format!("rl:{{{limit}")), "{text:?} -> {limit:?}");
            assert!(text.ends_with('}') && text.len() <= 1024);
        }
    }
    let _ = serde_json::from_slice::<TransferAnswer>(data);

    let Ok(r) = TransferRequest::parse(data) else {
        return;
    };
    assert!(key_limit(&r.key).is_some(), "key {:?}", r.key);
    assert!((1..=MAX_WINDOW_MS).contains(&r.window_ms));
    let whole = r.spec(Share::WHOLE).expect("a parsed request has a quota");
    assert_eq!((whole.count, whole.capacity, whole.period_ms()), (r.count, r.capacity, r.period_ms));
    assert_eq!(whole.whole(), whole);

    // A share from the input, in (0, 1].
    let ppm = data.iter().fold(17u32, |h, &b| h.wrapping_mul(31).wrapping_add(u32::from(b))) % 1_000_000 + 1;
    let share = Share::from_fraction(f64::from(ppm) / 1e6).expect("a share");
    let slice = r.spec(share).expect("the same quota, sliced");
    assert!(slice.count >= 1 && slice.count <= r.count, "{slice:?} of {r:?}");
    assert!(slice.capacity >= 1 && slice.capacity <= r.capacity, "{slice:?} of {r:?}");
    assert_eq!(slice.whole(), whole, "the slice forgot the whole");

    let body = serde_json::to_vec(&r).expect("serialises");
    assert_eq!(TransferRequest::parse(&body).as_ref(), Ok(&r), "round trip");
    let rebuilt = TransferRequest::new(r.id, &r.region, &r.key, &slice, r.want, r.window_ms);
    assert_eq!(rebuilt, r, "new() from the request's own quota");
});
