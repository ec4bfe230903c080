//! The gateway's own fields in HTTP/2's header compression (HPACK, RFC
//! 7541).
//!
//! The values no later response repeats (`RateLimit`'s counts,
//! `RateLimit-Remaining`, `x-request-id`) are made sensitive, so they go
//! out never-indexed and do not fill the connection's table with dead
//! entries ([`crate::limit::headers::changing`]). A never-indexed field
//! whose name is not in the table spells its name out too, and these
//! names are not in HPACK's static table: so one response in
//! [`SEED_EVERY`] on each HTTP/2 connection, the first among them, sends
//! them indexed. Their names are then in the table, and the responses
//! after refer to them by index (a byte or two) instead of spelling them
//! out (about 10 bytes each, Huffman-coded: 30 bytes a response).

use http::HeaderMap;

use crate::connection::ConnInfo;
use crate::limit::headers::{RATELIMIT, RATELIMIT_REMAINING};
use crate::proxy::X_REQUEST_ID;

/// One HTTP/2 response in this many (the first of a connection, then
/// every this-many-th) puts the changing fields' names in the table again:
/// other fields the table takes in the meantime may have evicted them.
/// Each seeding adds three entries (~170 of the table's 4,096 bytes).
pub(super) const SEED_EVERY: u32 = 256;

/// Before an HTTP/2 response on `conn` goes out: lets its changing fields
/// be indexed if it is a seeding one.
pub(super) fn seed(conn: &ConnInfo, headers: &mut HeaderMap) {
    if !conn.h2_responses.next().is_multiple_of(SEED_EVERY) {
        return;
    }
    for name in [&RATELIMIT, &RATELIMIT_REMAINING, &X_REQUEST_ID] {
        if let Some(v) = headers.get_mut(name) {
            v.set_sensitive(false);
        }
    }
}
