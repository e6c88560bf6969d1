//! One shard of the store: a table of at most `capacity` keys, each with its
//! state stored inline, and the order in which they last moved, evicting the
//! least recently moved.
//!
//! The recency rule is the one the crate docs state: a touched key moves to
//! the back only if it has not moved within the shard's last `θ` moves (an
//! eighth of its capacity, at least 1); a new key at a full shard evicts the
//! key that moved least recently. `tests/model.rs` checks every decision
//! and eviction against an executable model of that rule.
//!
//! Why not a linked hash map (this store used `hashlink`'s): its table holds
//! a pointer to a heap node holding the key and its state, so a hit cost the
//! table's line, then the node's, and a move wrote the two neighbours' nodes
//! and the list head as well. Here the key's digest and its state sit in
//! the table's own bucket, and a move appends a 16-byte record to a queue
//! instead of relinking anything: a hit that does not move writes nothing
//! but its own bucket.
//!
//! The queue is lazy: a key's earlier records are left behind when it moves
//! (a record is live only while its key's `moved` still equals its stamp),
//! skipped when they reach the front, and dropped by an incremental
//! compaction of a few records per move, so the queue stays within about
//! twice the capacity. No decision scans the shard, with one exception
//! paid as any hash table pays its growth: a full shard's table is rebuilt
//! at its own size, O(c), when removals' tombstones have used up its room
//! (see [`Shard::purge_tombstones`]), after thousands of evictions.

use std::collections::VecDeque;
use std::mem;

use hashbrown::HashTable;
use ratewarden_core::algorithm::{self, KeyState, Verdict};
use ratewarden_core::ban::{self, BanState};
use ratewarden_core::{Ban, Policy};

/// A shard of capacity `c` moves a touched key only if it has not moved in
/// its last `max(1, c / REORDER_FRACTION)` moves.
const REORDER_FRACTION: usize = 8;

/// How many moves a key of a shard of `capacity` keys may go without moving
/// again when touched.
fn reorder_after(capacity: usize) -> u64 {
    (capacity / REORDER_FRACTION).max(1) as u64
}

/// Records the compaction checks for every record it appends: above 1 it
/// outruns the appends, so a pass ends before the queue doubles again.
const COMPACT_STEP: usize = 4;

pub(crate) struct Shard {
    table: HashTable<Entry>,
    order: Order,
    capacity: usize,
    /// Moves to the back (insertions included) so far; an entry's `moved` is
    /// this count when it last moved, and the stamp of its live record.
    moves: u64,
    reorder_after: u64,
    /// The queue length at which a compaction pass starts.
    compact_at: usize,
    /// Keys evicted from this shard so far. Counted here, under the shard's
    /// lock, not in one counter of the store's: under a flood every
    /// decision evicts, and threads bumping one shared atomic moved its
    /// cache line, and the store's fields beside it, between cores on
    /// every decision (see `MemoryStore::evictions`).
    evictions: u64,
    /// Rebuilds of the table so far, for the tests.
    #[cfg(test)]
    purges: usize,
}

/// A key's digest, its state, and when it last moved: 56 bytes, aligned to
/// a 64-byte cache line so that every bucket is exactly one line. A lookup
/// of a held key then costs the control bytes' line and the bucket's, and
/// no more; with the key itself inline (96 bytes, two lines a bucket) the
/// tables of 10,000 warm keys outgrew a 1 MiB cache level, and a decision
/// missed it several times.
#[repr(align(64))]
struct Entry {
    digest: Digest,
    state: Option<KeyState>,
    moved: u64,
}

impl Entry {
    /// Whether a touch moves this key to the back of the order: it has not
    /// moved within the shard's last `reorder_after` of its `moves`. The
    /// eviction guarantee rests on every road asking this one question.
    #[inline(always)]
    fn due_to_move(&self, moves: u64, reorder_after: u64) -> bool {
        moves - self.moved >= reorder_after
    }
}

/// One move: the stamp it gave its key and the key's index hash, by which
/// the entry is found again.
#[derive(Clone, Copy)]
struct Record {
    stamp: u64,
    hash: u64,
}

/// The moves in stamp order, oldest first: `kept`, then `old`, then `new`.
/// Outside a compaction pass only `new` holds records; a pass takes them
/// all into `old` and moves the live ones to `kept`, a few per move, while
/// later moves go to `new`.
#[derive(Default)]
struct Order {
    kept: VecDeque<Record>,
    old: VecDeque<Record>,
    new: VecDeque<Record>,
}

impl Order {
    /// Counts a move in `moves` and appends its record; the move's stamp.
    fn push(&mut self, moves: &mut u64, hash: u64) -> u64 {
        *moves += 1;
        self.new.push_back(Record {
            stamp: *moves,
            hash,
        });
        *moves
    }

    fn pop_oldest(&mut self) -> Option<Record> {
        self.kept
            .pop_front()
            .or_else(|| self.old.pop_front())
            .or_else(|| self.new.pop_front())
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.kept.len() + self.old.len() + self.new.len()
    }
}

fn is_live(table: &HashTable<Entry>, record: Record) -> bool {
    table
        .find(record.hash, |e| e.moved == record.stamp)
        .is_some()
}

/// What the store keeps of a key: the two 64-bit halves of one 128-bit
/// keyed digest of the key's bytes under its algorithm's secret
/// ([`KeyHasher`]). `index` places the key (its shard, its slot); the pair
/// identifies it, and is all a rehash needs. Two distinct keys share a
/// state only if all 128 bits collide; the crate docs (Keys) say how
/// unlikely that is and why the store keeps no key.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Digest {
    pub(crate) index: u64,
    check: u64,
}

/// How many secrets a [`KeyHasher`] keeps: one per algorithm (tags 0 to 3)
/// and one per algorithm for the key's ban record (4 to 7).
pub(crate) const TAGS: usize = 8;

/// The keyed function a [`Digest`] is made of: SipHash-1-3 with a 128-bit
/// output, under a 128-bit secret key of the store's own for each
/// algorithm.
///
/// Its halves index and check a key, so that two distinct keys share one
/// state only if all 128 bits collide. SipHash is a pseudo-random function
/// keyed by 128 secret bits (the design claim of its authors, for the
/// 2-4 rounds; 1-3 is the variant Rust's own `HashMap` uses against
/// hash flooding): without the key, choosing keys whose digests collide,
/// in one half or in both, is no easier than guessing. The keys are drawn
/// from the OS for each store and never leave it.
///
/// Why a secret per algorithm rather than a tag byte hashed before the
/// key: the digests of one key under two algorithms are then two
/// independent pseudo-random functions' values, as unlikely to collide as
/// two keys', and the key's bytes reach SipHash's 8-byte words aligned. A
/// leading tag byte shifted every word of the key by one byte, and
/// assembling each from two loads cost a third of a decision's
/// instructions on one hot key.
///
/// SipHash is written here, the same function as `siphasher`'s
/// `SipHasher13` bit for bit (a test holds them equal): hashing one key
/// whole, `siphasher` keeps the bookkeeping of a stream written in pieces
/// (its buffered tail, its running length) and reads the last bytes one
/// width at a time, and its one-shot `hash` was slower still; this one
/// costs 22 instructions a decision less (`scripts/instructions.sh`,
/// 547 → 525 on the store's inline decision).
pub(crate) struct KeyHasher {
    /// SipHash's initial state under each algorithm tag's secret: a digest
    /// starts from a copy of it.
    keyed: [Sip; TAGS],
}

impl KeyHasher {
    /// A hasher under secret keys drawn from the OS, distinct from every
    /// other store's; the OS's error if it has no random source to draw
    /// them from.
    pub(crate) fn new() -> Result<Self, getrandom::Error> {
        let mut keys = [[0; 16]; TAGS];
        for key in &mut keys {
            getrandom::fill(key)?;
        }
        Ok(Self::with_keys(keys))
    }

    fn with_keys(keys: [[u8; 16]; TAGS]) -> Self {
        KeyHasher {
            keyed: keys.map(Sip::keyed),
        }
    }

    /// A hasher under keys an attacker knows (the same for every tag), to
    /// craft keys against.
    #[cfg(test)]
    fn known(key: [u8; 16]) -> Self {
        Self::with_keys([key; TAGS])
    }

    /// The digest of the key `key` under the algorithm tag `tag`
    /// (below [`TAGS`]).
    #[inline]
    pub(crate) fn digest(&self, tag: usize, key: &[u8]) -> Digest {
        self.keyed[tag].digest(key)
    }
}

/// SipHash-1-3 with a 128-bit output (Aumasson and Bernstein's SipHash:
/// one round per 8-byte word of the key, three to finish each half of the
/// output): its four words of state.
#[derive(Clone, Copy)]
struct Sip {
    v0: u64,
    v1: u64,
    v2: u64,
    v3: u64,
}

impl Sip {
    /// The initial state under a 128-bit secret.
    fn keyed(key: [u8; 16]) -> Sip {
        let (halves, _) = key.as_chunks::<8>();
        let (k0, k1) = (u64::from_le_bytes(halves[0]), u64::from_le_bytes(halves[1]));
        Sip {
            v0: k0 ^ 0x736f_6d65_7073_6575,
            // "dorandom", with the 128-bit output's 0xee in its low byte.
            v1: k1 ^ 0x646f_7261_6e64_6f83,
            v2: k0 ^ 0x6c79_6765_6e65_7261,
            v3: k1 ^ 0x7465_6462_7974_6573,
        }
    }

    #[inline(always)]
    fn round(&mut self) {
        self.v0 = self.v0.wrapping_add(self.v1);
        self.v1 = self.v1.rotate_left(13) ^ self.v0;
        self.v0 = self.v0.rotate_left(32);
        self.v2 = self.v2.wrapping_add(self.v3);
        self.v3 = self.v3.rotate_left(16) ^ self.v2;
        self.v0 = self.v0.wrapping_add(self.v3);
        self.v3 = self.v3.rotate_left(21) ^ self.v0;
        self.v2 = self.v2.wrapping_add(self.v1);
        self.v1 = self.v1.rotate_left(17) ^ self.v2;
        self.v2 = self.v2.rotate_left(32);
    }

    #[inline(always)]
    fn compress(&mut self, word: u64) {
        self.v3 ^= word;
        self.round();
        self.v0 ^= word;
    }

    /// The digest of `key`, read as little-endian words, its last bytes
    /// and its length's low byte making the last word.
    #[inline(always)]
    fn digest(mut self, key: &[u8]) -> Digest {
        let (words, tail) = key.as_chunks::<8>();
        for word in words {
            self.compress(u64::from_le_bytes(*word));
        }
        self.compress(((key.len() as u64 & 0xff) << 56) | partial_word(tail));
        self.v2 ^= 0xee;
        self.round();
        self.round();
        self.round();
        let index = self.v0 ^ self.v1 ^ self.v2 ^ self.v3;
        self.v1 ^= 0xdd;
        self.round();
        self.round();
        self.round();
        let check = self.v0 ^ self.v1 ^ self.v2 ^ self.v3;
        Digest { index, check }
    }
}

/// Up to 7 bytes as the low bytes of a little-endian word, in at most three
/// loads: copied into a zeroed word instead, they were a call to `memcpy`.
#[inline(always)]
fn partial_word(bytes: &[u8]) -> u64 {
    let mut word = 0;
    let mut at = 0;
    if let Some(four) = bytes.first_chunk::<4>() {
        word = u64::from(u32::from_le_bytes(*four));
        at = 4;
    }
    if let Some(two) = bytes[at..].first_chunk::<2>() {
        word |= u64::from(u16::from_le_bytes(*two)) << (8 * at);
        at += 2;
    }
    if let Some(&one) = bytes.get(at) {
        word |= u64::from(one) << (8 * at);
    }
    word
}

impl Shard {
    pub(crate) fn new(capacity: usize) -> Self {
        Shard {
            table: HashTable::new(),
            order: Order::default(),
            capacity,
            moves: 0,
            reorder_after: reorder_after(capacity),
            compact_at: capacity.saturating_mul(2).saturating_add(2),
            evictions: 0,
            #[cfg(test)]
            purges: 0,
        }
    }

    /// The number of keys held.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// The number of keys evicted so far.
    pub(crate) fn evictions(&self) -> u64 {
        self.evictions
    }

    /// Applies the policy to the key, touching it, and returns the verdict;
    /// another key evicted to make room is counted in `evictions`.
    // Inlined into its one caller, as the linked map's lookup was: called,
    // it returned the verdict through one more copy, a stall on a hot key.
    #[inline]
    pub(crate) fn decide(
        &mut self,
        digest: Digest,
        policy: &Policy,
        cost: u32,
        now: u64,
    ) -> Verdict {
        self.update(digest, |state| algorithm::apply(state, policy, cost, now))
    }

    /// [`decide`](Self::decide) when it is only a change of the key's
    /// state in place ([`algorithm::apply_held`]): a held key, not due to
    /// move in the eviction order, on the algorithm's common road. `None`,
    /// having changed nothing, otherwise.
    #[inline(always)]
    pub(crate) fn decide_held(
        &mut self,
        digest: Digest,
        policy: &Policy,
        cost: u32,
        now: u64,
    ) -> Option<Verdict> {
        let entry = self.table.find_mut(digest.index, |e| e.digest == digest)?;
        if entry.due_to_move(self.moves, self.reorder_after) {
            return None;
        }
        algorithm::apply_held(&mut entry.state, policy, cost, now)
    }

    /// Records a penalty on the key ([`algorithm::penalize`]), touching it
    /// and inserting it as an admission would.
    pub(crate) fn penalize(&mut self, digest: Digest, policy: &Policy, cost: u32, now: u64) {
        self.update(digest, |state| {
            algorithm::penalize(state, policy, cost, now)
        });
    }

    /// Runs `transition` on the key's state, touching the key, or on an
    /// empty state that is inserted if `transition` leaves something in it.
    // Always inlined, so that `decide` compiles to what it was before it
    // shared this with `penalize`: the verdict returned in registers.
    #[inline(always)]
    fn update<V>(
        &mut self,
        digest: Digest,
        transition: impl FnOnce(&mut Option<KeyState>) -> V,
    ) -> V {
        let hash = digest.index;
        if let Some(entry) = self.table.find_mut(hash, |e| e.digest == digest) {
            // Touched whatever the outcome: a refused request keeps its key
            // as recent as an admitted one, so an offender that keeps
            // hammering cannot be flooded out of the store.
            // An expired state (`KeyState::expires_at`) is not dropped
            // first: `apply` already treats it as empty at `now`. Keys leave
            // by eviction alone; nothing sweeps them.
            let moved = entry.due_to_move(self.moves, self.reorder_after);
            if moved {
                // Recorded before `apply`, so that a panic in it (the one
                // way a shard's lock is released mid-decision) cannot leave
                // a key whose live record is missing, which no eviction
                // would find.
                entry.moved = self.order.push(&mut self.moves, hash);
            }
            // Returned from here, not carried out of a closure with `moved`:
            // moving the verdict through a tuple copied it twice with wide
            // loads of narrow stores just made, a store-forwarding stall
            // that cost a hot key a third of its time.
            let verdict = transition(&mut entry.state);
            if moved {
                self.compact();
            }
            return verdict;
        }
        let mut state = None;
        let verdict = transition(&mut state);
        if state.is_none() {
            // Nothing to remember (a refusal on an empty state records
            // nothing), so nothing is inserted and nothing evicted.
            return verdict;
        }
        let evicted = self.table.len() >= self.capacity && self.evict();
        self.evictions += u64::from(evicted);
        if self.table.len() == self.table.capacity() && self.table.len() + 1 >= self.capacity {
            self.purge_tombstones();
        }
        let entry = Entry {
            digest,
            state,
            moved: self.order.push(&mut self.moves, hash),
        };
        self.table.insert_unique(hash, entry, |e| e.digest.index);
        self.compact();
        verdict
    }

    /// [`decide`](Self::decide) under a ban ([`ban::decide`]), the ban's
    /// record at `ban_digest` in this same shard, so that both change under
    /// one lock. A banned key's record is touched, as a refused key is, so
    /// that a flood of fresh keys cannot evict an offender that keeps
    /// hammering; nothing else is written while the ban lasts.
    pub(crate) fn decide_banned(
        &mut self,
        digest: Digest,
        ban_digest: Digest,
        (policy, ban): (&Policy, &Ban),
        cost: u32,
        now: u64,
    ) -> (Verdict, bool) {
        if let Some(refused) = ban::banned(&self.ban_state(ban_digest), now) {
            self.update(ban_digest, |_| ());
            return (refused, true);
        }
        let verdict = self.decide(digest, policy, cost, now);
        if verdict.allowed {
            return (verdict, false);
        }
        self.update(ban_digest, |slot| {
            let mut state = slot.as_ref().and_then(ban_record::decode);
            let answer = ban::breach(&mut state, ban, now, verdict);
            *slot = state.map(ban_record::encode);
            answer
        })
    }

    /// The ban record at `ban_digest`, read without touching it.
    pub(crate) fn ban_state(&self, ban_digest: Digest) -> Option<BanState> {
        self.table
            .find(ban_digest.index, |e| e.digest == ban_digest)
            .and_then(|e| e.state.as_ref())
            .and_then(ban_record::decode)
    }

    /// The verdict [`decide`](Self::decide) would give, changing nothing:
    /// the key is neither touched nor inserted.
    pub(crate) fn peek(&self, digest: Digest, policy: &Policy, cost: u32, now: u64) -> Verdict {
        let state = self
            .table
            .find(digest.index, |e| e.digest == digest)
            .map_or(&None, |e| &e.state);
        algorithm::peek(state, policy, cost, now)
    }

    /// Forgets a key. Its records in the move order stay behind as stale
    /// ones, as an evicted key's do, for compaction to drop.
    pub(crate) fn remove(&mut self, digest: Digest) {
        if let Ok(entry) = self.table.find_entry(digest.index, |e| e.digest == digest) {
            entry.remove();
        }
    }

    /// The state of a held key, for a refund, which neither touches nor
    /// inserts (so it can neither evict nor be used to flood the shard).
    pub(crate) fn state_mut(&mut self, digest: Digest) -> Option<&mut Option<KeyState>> {
        self.table
            .find_mut(digest.index, |e| e.digest == digest)
            .map(|e| &mut e.state)
    }

    /// Rebuilds the table at the size it has. A full shard's table can run
    /// out of room with fewer keys than slots: hashbrown leaves a tombstone
    /// where a removed key's probe window was full, and only an insertion
    /// into an empty slot uses room up. Left to itself, the table would
    /// then double (hashbrown rehashes in place only below half its
    /// capacity), for keys the cap says never come; rebuilt, it stays at
    /// the size the cap needs. O(c) for a shard of capacity `c`, after
    /// thousands of evictions (each leaves a tombstone only when its
    /// window was full), as a growing table's rehash is.
    ///
    /// The rebuilt table has room for `c / 64` keys over the cap: rebuilt
    /// with none to spare (a cap of exactly a table's capacity, 7 × 2ᵏ),
    /// the next tombstone would bring the next rebuild, O(c) every few
    /// evictions. With that room one comes at most every `c / 64`
    /// tombstones: at most 64 entries moved per eviction, amortised.
    /// Measured over 50 c of churn after 50 c of warm-up (a throwaway
    /// count of this function's calls): 2 moves per eviction at the
    /// default store's 6,250-key shards (a rebuild every 3,094 evictions,
    /// the power-of-two table leaving 918 keys of room), 0.1 where the
    /// room forced a table twice the size (1,792 keys), and 22 where a cap
    /// sits just under a table's capacity (1,750 and 7,000 keys: a rebuild
    /// every 78 and 311 evictions). A larger room would lower that worst
    /// case only by doubling those shards' tables: this keeps the memory.
    #[cold]
    fn purge_tombstones(&mut self) {
        #[cfg(test)]
        {
            self.purges += 1;
        }
        let room = self.capacity.saturating_add(self.capacity / 64 + 1);
        // Rebuilt in its own allocation, which `drain` keeps, rather than
        // in a new table: the table is 64-byte aligned, and glibc serves an
        // aligned block of a size it has just freed from fresh memory, not
        // from the freed block, so a new table at every rebuild left the
        // old one's memory behind. The process's RSS under a flood then
        // wandered by 10 % around a level 5 MiB above the store's own.
        // The entries wait in a plain `Vec`, whose blocks glibc does reuse.
        let held: Vec<(Digest, Option<KeyState>, u64)> = self
            .table
            .drain()
            .map(|e| (e.digest, e.state, e.moved))
            .collect();
        if self.table.capacity() < room {
            // Only while the table is still smaller than the cap needs.
            self.table = HashTable::with_capacity(room);
        }
        for (digest, state, moved) in held {
            let entry = Entry {
                digest,
                state,
                moved,
            };
            self.table
                .insert_unique(digest.index, entry, |e| e.digest.index);
        }
    }

    /// Removes the key that moved least recently; `false` if there is none.
    fn evict(&mut self) -> bool {
        while let Some(record) = self.order.pop_oldest() {
            // Stamps are unique within a shard, so the stamp alone tells the
            // key's live record from the ones it left behind.
            if let Ok(entry) = self
                .table
                .find_entry(record.hash, |e| e.moved == record.stamp)
            {
                entry.remove();
                return true;
            }
        }
        false
    }

    /// A step of compaction: amortised O(1), and never more than
    /// `COMPACT_STEP` lookups in one call.
    fn compact(&mut self) {
        let Order { kept, old, new } = &mut self.order;
        if old.is_empty() {
            if kept.len() + new.len() <= self.compact_at {
                return;
            }
            mem::swap(old, new);
        }
        for _ in 0..COMPACT_STEP {
            match old.pop_front() {
                Some(record) if is_live(&self.table, record) => kept.push_back(record),
                Some(_) => {}
                None => break,
            }
        }
        if old.is_empty() {
            kept.append(new);
            mem::swap(kept, new);
            // The pass leaves two spent buffers behind; each would otherwise
            // keep the queue's whole size for the life of the shard.
            old.shrink_to_fit();
            kept.shrink_to_fit();
        }
    }

    /// Records in the queue, live and stale: for the bound checks in tests.
    #[cfg(test)]
    pub(crate) fn records(&self) -> usize {
        self.order.len()
    }
}

/// A ban record in the shard's table, which holds one type, the
/// algorithms' [`KeyState`]: the record rides in the three-word sliding
/// window variant, under a secret of its own (so no algorithm ever reads
/// it, nor it an algorithm's state), and shares the table's bound, its
/// eviction order and its touches. A type of its own would have grown every
/// entry past its one cache line.
mod ban_record {
    use super::{BanState, KeyState};

    pub(super) fn encode(s: BanState) -> KeyState {
        KeyState::SlidingWindow {
            start: s.until,
            current: s.start,
            previous: (u64::from(s.offences) << 32) | u64::from(s.breaches),
        }
    }

    pub(super) fn decode(state: &KeyState) -> Option<BanState> {
        match *state {
            KeyState::SlidingWindow {
                start,
                current,
                previous,
            } => Some(BanState {
                until: start,
                offences: (previous >> 32) as u32,
                start: current,
                breaches: previous as u32,
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn policy() -> Policy {
        Policy::fixed_window(1_000, Duration::from_secs(3_600)).expect("valid policy")
    }

    /// One hasher for every test shard: the tests compare shards' behaviour
    /// on the same keys, not the hash.
    fn digest(k: u64) -> Digest {
        static HASHER: std::sync::LazyLock<KeyHasher> =
            std::sync::LazyLock::new(|| KeyHasher::new().unwrap());
        HASHER.digest(1, &k.to_le_bytes())
    }

    /// Decides key `k` (tag 1, its little-endian bytes), and whether that
    /// evicted another key.
    fn decide(shard: &mut Shard, k: u64, policy: &Policy, now: u64) -> (Verdict, bool) {
        let before = shard.evictions();
        let verdict = shard.decide(digest(k), policy, 1, now);
        (verdict, shard.evictions() > before)
    }

    /// Whether key `k` is held.
    fn held(shard: &mut Shard, k: u64) -> bool {
        shard.state_mut(digest(k)).is_some()
    }

    #[test]
    fn entries_keep_their_size() {
        // The per-key memory the crate docs state rests on these.
        assert_eq!(mem::size_of::<Digest>(), 16);
        assert_eq!(mem::size_of::<Entry>(), 64);
        assert_eq!(mem::align_of::<Entry>(), 64);
        assert_eq!(mem::size_of::<Record>(), 16);
    }

    /// Two keys are one only if both halves of their digests agree: keys
    /// whose index hashes collide (as 1 in 2⁶⁴ pairs do) keep two states.
    #[test]
    fn keys_sharing_an_index_hash_keep_their_own_states() {
        let mut shard = Shard::new(8);
        let policy = Policy::fixed_window(1, Duration::from_secs(60)).expect("valid policy");
        let a = Digest { index: 7, check: 1 };
        let b = Digest { index: 7, check: 2 };
        assert!(shard.decide(a, &policy, 1, 0).allowed);
        assert!(shard.decide(b, &policy, 1, 0).allowed, "b shared a's state");
        assert!(!shard.decide(a, &policy, 1, 0).allowed);
        assert!(!shard.decide(b, &policy, 1, 0).allowed);
        assert_eq!(shard.len(), 2);
        assert!(shard.state_mut(Digest { index: 7, check: 3 }).is_none());
    }

    #[test]
    fn digests_tell_tags_keys_and_stores_apart() {
        let hasher = KeyHasher::new().unwrap();
        let d = hasher.digest(3, b"abc");
        assert_eq!(d, hasher.digest(3, b"abc"));
        assert_ne!(d, hasher.digest(2, b"abc"));
        assert_ne!(d, hasher.digest(3, b"abd"));
        assert_ne!(hasher.digest(1, b""), hasher.digest(1, &[0]));
        let long = vec![b'x'; 10_000];
        assert_ne!(hasher.digest(0, &long), hasher.digest(0, &long[1..]));
        // The two halves are keyed independently, and so is each store.
        assert_ne!(d.index, d.check);
        let other = KeyHasher::new().unwrap().digest(3, b"abc");
        assert_ne!(d.index, other.index);
        assert_ne!(d.check, other.check);
    }

    /// The store's SipHash-1-3 is `siphasher`'s, bit for bit, for keys
    /// of every length up to 70 bytes (every tail length, several words)
    /// under three secrets.
    #[test]
    fn digests_are_siphash_1_3() {
        use siphasher::sip128::{Hasher128, SipHasher13};
        use std::hash::Hasher;
        let key: Vec<u8> = (0..70u8).map(|b| b.wrapping_mul(37) ^ 0x5a).collect();
        for secret in [[0u8; 16], *b"a secret 16 byte", [0xff; 16]] {
            let hasher = KeyHasher::known(secret);
            for len in 0..=key.len() {
                let mut reference = SipHasher13::new_with_key(&secret);
                reference.write(&key[..len]);
                let reference = reference.finish128();
                let digest = hasher.digest(3, &key[..len]);
                assert_eq!(
                    (digest.index, digest.check),
                    (reference.h1, reference.h2),
                    "{len} bytes"
                );
            }
        }
    }

    /// HashDoS: keys crafted so that their digests under a known key all
    /// start the same probe sequence (the same low 12 bits, a table of
    /// 4,096 slots) spread under a store's own secret key exactly as random
    /// keys do. Without the secret, crafting gains nothing.
    #[test]
    fn keys_crafted_against_a_known_key_spread_like_random_ones_under_a_secret_one() {
        const SLOTS: u64 = 4_096;
        let known = KeyHasher::known([0; 16]);
        let slot = |h: &KeyHasher, key: &[u8]| h.digest(3, key).index % SLOTS;
        let mut crafted = Vec::new();
        let mut candidate = 0u64;
        while crafted.len() < 2_000 {
            let key = format!("client:{candidate:032x}");
            candidate += 1;
            if slot(&known, key.as_bytes()) == 0 {
                crafted.push(key);
            }
        }
        let random: Vec<String> = (0..2_000u64)
            .map(|i| format!("client:{:032x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15)))
            .collect();
        let distinct = |h: &KeyHasher, keys: &[String]| {
            let mut slots: Vec<u64> = keys.iter().map(|k| slot(h, k.as_bytes())).collect();
            slots.sort_unstable();
            slots.dedup();
            slots.len()
        };
        // The attack works against the key it was crafted for.
        assert_eq!(distinct(&known, &crafted), 1);
        // Under a secret key, 2,000 keys fill about 4,096 × (1 − e^(−2000/4096))
        // = 1,582 distinct slots, crafted or not (±90 is six standard
        // deviations of that count, about 15).
        let secret = KeyHasher::new().unwrap();
        for (what, keys) in [("crafted", &crafted), ("random", &random)] {
            let n = distinct(&secret, keys);
            assert!((1_492..=1_672).contains(&n), "{what} keys filled {n} slots");
        }
    }

    /// Hits that keep moving keys, with no eviction to pop the queue, must
    /// not grow it past its bound: the compaction keeps up.
    #[test]
    fn queue_stays_bounded_without_evictions() {
        let capacity = 64;
        let mut shard = Shard::new(capacity);
        let policy = policy();
        let mut most = 0;
        for round in 0..2_000u64 {
            for k in 0..capacity as u64 {
                let (verdict, evicted) = decide(&mut shard, k, &policy, round);
                assert!(!evicted);
                let _ = verdict;
                most = most.max(shard.records());
            }
        }
        assert_eq!(shard.len(), capacity);
        // compact_at, plus what one pass can gather before it ends.
        let bound = shard.compact_at + shard.compact_at / COMPACT_STEP + 1;
        assert!(most <= bound, "{most} records, bound {bound}");
        assert!(most > capacity, "the test never made stale records");
    }

    /// A flood of distinct keys churns a full shard for many times its
    /// capacity: its table keeps the size the cap needs instead of
    /// doubling when tombstones use its room up.
    #[test]
    fn a_churning_full_shard_keeps_its_table_size() {
        // 2,048 buckets, at most 1,792 keys: a table that runs 85 % full.
        let capacity = 1_750;
        let mut shard = Shard::new(capacity);
        let policy = policy();
        let buckets = HashTable::<Entry>::with_capacity(capacity).num_buckets();
        for k in 0..200 * capacity as u64 {
            decide(&mut shard, k, &policy, 0);
            assert!(shard.table.num_buckets() <= buckets, "grew at key {k}");
        }
        assert_eq!(shard.len(), capacity);
    }

    /// A rebuild at the table's size keeps the table's allocation: glibc
    /// serves a 64-byte-aligned block of a size it has just freed from
    /// fresh memory, so a new table at each rebuild left the old ones'
    /// memory behind (5 MiB more resident under the flood bench, wandering
    /// by 10 %). A new table is allocated while the old one is still held,
    /// so the two would share no bucket address.
    #[test]
    fn a_rebuild_keeps_the_tables_allocation() {
        let capacity = 1_750; // rebuilt about every 80 evictions
        let mut shard = Shard::new(capacity);
        let policy = policy();
        let mut k = 0;
        let mut churn_until_rebuilt = |shard: &mut Shard| {
            let purges = shard.purges;
            while shard.purges == purges {
                decide(shard, k, &policy, 0);
                k += 1;
            }
        };
        // The first rebuild sizes the table for the cap and its room.
        churn_until_rebuilt(&mut shard);
        let slots = |shard: &Shard| -> std::collections::HashSet<usize> {
            shard
                .table
                .iter()
                .map(|e| std::ptr::from_ref(e) as usize)
                .collect()
        };
        for _ in 0..3 {
            let before = slots(&shard);
            churn_until_rebuilt(&mut shard);
            assert!(
                !before.is_disjoint(&slots(&shard)),
                "the rebuild allocated a new table"
            );
        }
    }

    /// A cap of exactly a table's capacity (7 × 2ᵏ) leaves no room after a
    /// rebuild at the cap; the rebuild makes some, so the table is not
    /// rebuilt again at every few evictions.
    #[test]
    fn a_cap_of_exactly_a_tables_capacity_is_not_rebuilt_every_few_evictions() {
        let capacity = 7 * 256;
        let mut shard = Shard::new(capacity);
        let policy = policy();
        let churn = 100 * capacity as u64;
        for k in 0..churn {
            decide(&mut shard, k, &policy, 0);
        }
        assert_eq!(shard.len(), capacity);
        // Rebuilt with no room to spare, this table was rebuilt thousands
        // of times over this churn.
        assert!(shard.purges <= 10, "rebuilt {} times", shard.purges);
    }

    /// The queue holds a live record for every key through compactions, so
    /// evictions keep finding victims and follow the move order.
    #[test]
    fn evictions_follow_the_move_order_across_compactions() {
        let capacity = 16; // θ = 2
        let mut shard = Shard::new(capacity);
        let policy = policy();
        for k in 0..capacity as u64 {
            decide(&mut shard, k, &policy, 0);
        }
        // Keep touching the first half so compactions run and the second
        // half falls to the front.
        for round in 0..200 {
            for k in 0..(capacity / 2) as u64 {
                decide(&mut shard, k, &policy, round);
            }
        }
        for n in 0..(capacity / 2) as u64 {
            let new = 1_000 + n;
            let (_, evicted) = decide(&mut shard, new, &policy, 0);
            assert!(evicted);
            let gone = capacity as u64 / 2 + n;
            assert!(
                !held(&mut shard, gone),
                "key {gone} should have been evicted"
            );
        }
        for k in 0..(capacity / 2) as u64 {
            assert!(held(&mut shard, k));
        }
        assert_eq!(shard.len(), capacity);
    }
}
