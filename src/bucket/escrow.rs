//! The escrow of a hot limit (docs/hot-limits.md): calls admitted against a state that
//! counts every debit still in flight, so that transactions on one key need not wait for
//! each other's commits, and never admitted beyond what the limit allows.
//!
//! A debit is a call that took tokens: its instant and its count. The escrow keeps `base`,
//! the state after every settled debit, and the debits admitted since, in admission order,
//! each in flight or committed. A call is admitted against `tail`, the base with every
//! listed debit applied. In every kind the state after a debit is a monotone function of
//! the state before it, so an abort, which removes a debit from anywhere in the list, can
//! only leave the tail as permissive as before or more: every admission made while the
//! debit was listed stays valid. The tail is recomputed from the base then, because the
//! token bucket's clamp at `capacity` makes adding the count back wrong (see the test
//! `an_abort_in_the_middle_recomputes_rather_than_adds_back`). Committed debits at the
//! front of the list are folded into the base.
//!
//! Pure and of fixed size (a ring of `N` debits), so that it lives in shared memory as it
//! is (`shmem::hot`).

use super::types::{Counts, MAX_COUNTS};
use super::{check, credit, plan, plan_credit, Config, Mode, Outcome, State};

/// A call that took tokens, as it is replayed: refilled to `at`, then `count` taken; or, with
/// a negative `count`, a credit of its opposite (memory limits only).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Debit {
    pub seq: u64,
    pub at: f64,
    pub count: f64,
    pub committed: bool,
}

const NO_DEBIT: Debit = Debit { seq: 0, at: 0.0, count: 0.0, committed: false };

/// The state after `debit`: refilled to its instant, its count taken whatever is left (it
/// was admitted once, and is replayed as it was); a credit gives back what the state still
/// counts of it.
pub fn apply(state: &State, config: &Config, debit: &Debit) -> State {
    if debit.is_credit() {
        return credit::credit(state, config, debit.at, -debit.count).0;
    }
    check(state, config, debit.at, debit.count, false).state()
}

impl Debit {
    pub fn is_credit(&self) -> bool {
        self.count < 0.0
    }

    /// Whether the tail counts it: a credit only once committed, so that no call is admitted
    /// on tokens a rollback could take back.
    fn in_tail(&self) -> bool {
        !self.is_credit() || self.committed
    }
}

/// What `admit` decided: the outcome as `plan` gives it (with the instant it was decided
/// at), and the debit's sequence number when it took tokens.
#[derive(Clone, Debug)]
pub struct Admitted {
    pub outcome: Outcome,
    pub seq: Option<u64>,
}

/// A call's `plan` on an escrow's tail at an instant, made before its admission
/// (`admit_planned`).
pub struct Planned {
    pub tail: State,
    pub at: f64,
    pub outcome: Outcome,
}

/// How an escrow keeps a state: whole (`Wide`, for hot limits), or packed into fewer bytes
/// for the kinds that need them (memory limits, one entry per key). Either is plain data, as
/// shared memory needs: a `State`'s many counts are on the heap.
pub trait Stored: Copy {
    fn store(state: &State) -> Self;
    fn load(&self) -> State;
}

/// A state with every count inline.
#[derive(Clone, Copy, Debug)]
pub struct Wide {
    value: f64,
    ts: f64,
    len: usize,
    counts: [f64; MAX_COUNTS],
    granted_at: Option<f64>,
}

impl Stored for Wide {
    fn store(state: &State) -> Wide {
        let counts = state.counts.as_slice();
        let mut wide = Wide { value: state.value, ts: state.ts, len: counts.len(), counts: [0.0; MAX_COUNTS], granted_at: state.granted_at };
        wide.counts[..counts.len()].copy_from_slice(counts);
        wide
    }

    fn load(&self) -> State {
        let counts = Counts::new(&self.counts[..self.len]).expect("at most MAX_COUNTS counts");
        State { value: self.value, ts: self.ts, counts, granted_at: self.granted_at }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct Escrow<const N: usize, S: Stored = Wide> {
    /// The state after every debit before the list.
    base: S,
    /// The base with every listed debit applied, in order: what calls are admitted against.
    tail: S,
    /// The latest instant of a debit in the base. Listed debits' instants never go back
    /// (see `admit`), so the last listed one, or else this, is the latest instant of all.
    base_at: f64,
    /// The listed debits, oldest at `head`, in ascending `seq`.
    ring: [Debit; N],
    head: usize,
    len: usize,
    /// Debits folded into the base while still in flight, because the ring was full.
    sunk: u64,
    /// Of those, the ones whose transactions have not ended yet: until they do, a rebuild
    /// from the committed log would not count them.
    sunk_in_flight: u64,
}

impl<const N: usize, S: Stored> Escrow<N, S> {
    /// An escrow over `base`, the committed state.
    #[cfg(test)]
    pub fn new(base: State) -> Self {
        Self::new_at(base, f64::NEG_INFINITY)
    }

    /// An escrow over `base`, the committed state, whose latest debit was at `base_at`.
    pub fn new_at(base: State, base_at: f64) -> Self {
        let base = S::store(&base);
        Escrow { base, tail: base, base_at, ring: [NO_DEBIT; N], head: 0, len: 0, sunk: 0, sunk_in_flight: 0 }
    }

    /// Start over in place from `base`, the committed state, whose latest debit was at
    /// `base_at`: an escrow in shared memory is too big to build on the stack and move.
    ///
    /// # Safety
    /// `this` points to writable memory of an `Escrow<N>` whose ring holds valid debits
    /// (memory of all zeros does: numbers and `false`); every other field is written here.
    pub unsafe fn restart(this: *mut Self, base: State, base_at: f64) {
        // SAFETY: the caller's promise; only fields are written, through raw pointers, so
        // nothing reads the fields that may not be valid yet.
        unsafe {
            (&raw mut (*this).base).write(S::store(&base));
            (&raw mut (*this).tail).write(S::store(&base));
            (&raw mut (*this).base_at).write(base_at);
            (&raw mut (*this).head).write(0);
            (&raw mut (*this).len).write(0);
            (&raw mut (*this).sunk).write(0);
            (&raw mut (*this).sunk_in_flight).write(0);
        }
    }

    #[cfg(test)]
    pub fn base(&self) -> State {
        self.base.load()
    }

    pub fn tail(&self) -> State {
        self.tail.load()
    }

    /// The instant a call at `now` is admitted at.
    pub fn admission_instant(&self, now: f64) -> f64 {
        let latest = if self.len > 0 { self.at(self.len - 1).at } else { self.base_at };
        now.max(latest)
    }

    /// The first sequence number not settled, if any: every debit before it committed,
    /// aborted or sunk (`None`: every debit). What the fold may move from the debit log
    /// into the base row.
    pub fn unsettled_from(&self) -> Option<u64> {
        (self.len > 0).then(|| self.at(0).seq)
    }

    /// The tail and its latest debit's instant: what is committed, with the debits still in
    /// flight counted as if they will commit and the credits as if they will not. A state
    /// to start over from that never admits more than the escrow would (at rest, when
    /// nothing is in flight, the committed state itself).
    pub fn snapshot(&self) -> (State, f64) {
        (self.tail.load(), self.admission_instant(f64::NEG_INFINITY))
    }

    /// The numbers of the debits listed in flight, oldest first.
    pub fn in_flight(&self) -> impl Iterator<Item = u64> + '_ {
        (0..self.len).map(|i| self.at(i)).filter(|d| !d.committed).map(|d| d.seq)
    }

    /// Whether the ring is full: the next admission sinks the older half.
    pub fn full(&self) -> bool {
        self.len == N
    }

    /// Whether nothing is listed and no sunk debit is still in flight: only then does the
    /// committed log hold everything this escrow counts, so that it may be rebuilt from it.
    pub fn idle(&self) -> bool {
        self.len == 0 && self.sunk_in_flight == 0
    }

    /// Debits folded into the base while still in flight (an abort of one of them gives
    /// nothing back until the escrow is rebuilt from the committed log).
    #[cfg(test)]
    pub fn sunk(&self) -> u64 {
        self.sunk
    }

    fn at(&self, i: usize) -> &Debit {
        &self.ring[(self.head + i) % N]
    }

    fn at_mut(&mut self, i: usize) -> &mut Debit {
        &mut self.ring[(self.head + i) % N]
    }

    /// The list position of `seq`, if listed.
    fn find(&self, seq: u64) -> Option<usize> {
        let (mut low, mut high) = (0, self.len);
        while low < high {
            let mid = (low + high) / 2;
            match self.at(mid).seq.cmp(&seq) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Greater => high = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    fn pop_into_base(&mut self, config: &Config) -> Debit {
        let debit = *self.at(0);
        self.base = S::store(&apply(&self.base.load(), config, &debit));
        self.base_at = self.base_at.max(debit.at);
        self.head = (self.head + 1) % N;
        self.len -= 1;
        debit
    }

    /// Take `count` at `now` (mode `'all'`, one row, no `min_gap`: what the argument
    /// covers) against the tail; list the debit in flight as number `seq` when it takes
    /// tokens. `seq` is above every number listed (the caller draws it under the lock that
    /// serializes admissions; numbers it does not use are simply skipped).
    ///
    /// A call whose clock is behind a listed debit's instant is admitted at that instant:
    /// admitted at its own, it would be checked against a tail refilled to a later instant,
    /// which the debit's abort would then take away. So instants never go back along the
    /// list; an abort takes back the instant of the debit it removes.
    pub fn admit(&mut self, config: &Config, now: f64, count: f64, reserve: bool, seq: u64) -> Admitted {
        self.admit_planned(config, now, count, reserve, seq, None)
    }

    /// `admit`, with `planned`: this call's `plan` as its caller made it already, with the
    /// tail and the instant it planned on. `plan` being a function of those (and of the call),
    /// its outcome is taken as it is while they are still the escrow's, planned again
    /// otherwise.
    pub fn admit_planned(
        &mut self,
        config: &Config,
        now: f64,
        count: f64,
        reserve: bool,
        seq: u64,
        planned: Option<Planned>,
    ) -> Admitted {
        assert!(
            config.mode == Mode::All && config.shards == 1 && config.min_gap.is_none(),
            "an escrow admits in mode 'all', on one row, without min_gap"
        );
        assert!(self.len == 0 || self.at(self.len - 1).seq < seq, "debits are numbered in admission order");
        let at = self.admission_instant(now);
        let tail = self.tail.load();
        let outcome = match planned {
            Some(Planned { tail: planned_on, at: planned_at, outcome }) if planned_on == tail && planned_at == at => outcome,
            _ => plan(&[tail], config, at, count, reserve),
        };
        if !outcome.ok || count <= 0.0 {
            return Admitted { outcome, seq: None };
        }
        self.make_room(config);
        self.tail = S::store(&outcome.after[0].0);
        self.list(Debit { seq, at, count, committed: false });
        Admitted { outcome, seq: Some(seq) }
    }

    /// Give back `count` at `now` (`credit`), listed as number `seq`: counted by the tail only
    /// once its transaction commits. The outcome is the tail's with the credit applied, as
    /// the caller's answer.
    pub fn credit(&mut self, config: &Config, now: f64, count: f64, seq: u64) -> Admitted {
        assert!(self.len == 0 || self.at(self.len - 1).seq < seq, "debits are numbered in admission order");
        let at = self.admission_instant(now);
        let outcome = plan_credit(&[self.tail.load()], config, at, count);
        if outcome.granted >= 0.0 {
            return Admitted { outcome, seq: None };
        }
        self.make_room(config);
        self.list(Debit { seq, at, count: -count, committed: false });
        Admitted { outcome, seq: Some(seq) }
    }

    fn list(&mut self, debit: Debit) {
        let len = self.len;
        *self.at_mut(len) = debit;
        self.len += 1;
    }

    /// Full: a transaction holding an old debit is still open. Fold the older half into the
    /// base as if committed, which only keeps them counted; a credit in flight among them is
    /// dropped instead (its give-back is lost, never counted before its commit).
    fn make_room(&mut self, config: &Config) {
        if self.len < N {
            return;
        }
        for _ in 0..N.div_ceil(2) {
            let front = *self.at(0);
            if front.committed {
                self.pop_into_base(config);
                continue;
            }
            if front.is_credit() {
                self.head = (self.head + 1) % N;
                self.len -= 1;
            } else {
                self.pop_into_base(config);
            }
            self.sunk += 1;
            self.sunk_in_flight += 1;
        }
        self.settle(config);
        self.recompute(config);
    }

    /// The tail from the base through every listed debit it counts.
    fn recompute(&mut self, config: &Config) {
        let mut tail = self.base.load();
        for j in 0..self.len {
            let debit = *self.at(j);
            if debit.in_tail() {
                tail = apply(&tail, config, &debit);
            }
        }
        self.tail = S::store(&tail);
    }

    /// The transaction of debit `seq` committed. False when it is no longer listed (sunk).
    pub fn commit(&mut self, config: &Config, seq: u64) -> bool {
        let Some(i) = self.find(seq) else { return self.sunk_ended() };
        self.at_mut(i).committed = true;
        if self.at(i).is_credit() {
            self.recompute(config);
        }
        self.settle(config);
        true
    }

    /// A debit no longer listed ended: it was sunk (a caller ends each debit once).
    fn sunk_ended(&mut self) -> bool {
        self.sunk_in_flight = self.sunk_in_flight.saturating_sub(1);
        false
    }

    /// Fold the committed debits at the front into the base.
    fn settle(&mut self, config: &Config) {
        while self.len > 0 && self.at(0).committed {
            self.pop_into_base(config);
        }
    }

    /// The (sub)transaction of debit `seq` aborted: unlist it and recompute the tail. False
    /// when it is no longer listed (sunk).
    pub fn abort(&mut self, config: &Config, seq: u64) -> bool {
        let Some(i) = self.find(seq) else { return self.sunk_ended() };
        for j in i..self.len - 1 {
            *self.at_mut(j) = *self.at(j + 1);
        }
        self.len -= 1;
        self.recompute(config);
        // Committed debits queued behind the aborted one are settled now.
        self.settle(config);
        true
    }
}

#[cfg(test)]
mod tests {
    use rand::{rngs::StdRng, seq::SliceRandom, Rng, SeedableRng};

    use super::super::tests::{config, ALL_KINDS, NOW};
    use super::super::{check, fresh_state, Config, Kind, State};
    use super::super::plan;
    use super::{apply, Debit, Escrow, Planned};

    fn available(state: &State, c: &Config, now: f64) -> f64 {
        check(state, c, now, 0.0, false).available
    }

    /// Whether `a` is no more permissive than `b`: as many tokens or fewer at every instant
    /// from `now` over two periods, at steps fine enough to see each window and cell.
    fn no_more_permissive(a: State, b: State, c: &Config, now: f64) -> bool {
        let steps = 4 * c.buckets.max(2);
        (0..=2 * steps).all(|j| {
            let t = now + c.period * f64::from(j) / f64::from(steps);
            available(&a, c, t) <= available(&b, c, t) + 1e-9
        })
    }

    #[test]
    fn an_abort_in_the_middle_recomputes_rather_than_adds_back() {
        let c = config(Kind::TokenBucket, 10.0, 10_000.0);
        let mut escrow = Escrow::<8>::new(fresh_state(&c, NOW, 0.0));
        let first = escrow.admit(&c, NOW, 5.0, false, 1).seq.expect("admitted");
        // Full again 5 s later (the clamp drops what would refill beyond capacity)...
        let second = escrow.admit(&c, NOW + 5_000.0, 5.0, false, 2).seq.expect("admitted");
        assert_eq!(available(&escrow.tail(), &c, NOW + 5_000.0), 5.0);
        // ...so without the first call the second still leaves 5, not 10: adding the first
        // call's 5 back would admit 5 tokens the bucket never had.
        assert!(escrow.abort(&c, first));
        assert_eq!(available(&escrow.tail(), &c, NOW + 5_000.0), 5.0);
        assert!(escrow.commit(&c, second));
        assert_eq!(escrow.unsettled_from(), None);
    }

    #[test]
    fn a_plan_made_on_another_tail_or_instant_is_made_again() {
        let c = config(Kind::FixedWindow, 3.0, 60_000.0);
        let mut escrow = Escrow::<8>::new(fresh_state(&c, NOW, 0.0));
        let full = escrow.tail();
        // Planned on the full window, before three calls took it all: denied on the tail.
        let stale = plan(std::slice::from_ref(&full), &c, NOW, 1.0, false);
        assert!(stale.ok);
        (1..=3).for_each(|n| assert!(escrow.admit(&c, NOW, 1.0, false, n).seq.is_some()));
        let planned = Planned { tail: full, at: NOW, outcome: stale.clone() };
        assert_eq!(escrow.admit_planned(&c, NOW, 1.0, false, 4, Some(planned)).seq, None, "the tail moved on");
        // On the same tail at another instant, neither.
        let mut other = Escrow::<8>::new(fresh_state(&c, NOW, 0.0));
        let denied = plan(&[other.tail()], &c, NOW, 4.0, false);
        assert!(!denied.ok);
        let planned = Planned { tail: other.tail(), at: NOW - 1.0, outcome: denied.clone() };
        assert!(other.admit_planned(&c, NOW, 1.0, false, 1, Some(planned)).seq.is_some(), "planned at another instant");
        // On the same tail and instant, the plan is the admission's.
        let mut same = Escrow::<8>::new(fresh_state(&c, NOW, 0.0));
        let planned = Planned { tail: same.tail(), at: NOW, outcome: denied };
        assert_eq!(same.admit_planned(&c, NOW, 1.0, false, 1, Some(planned)).seq, None, "taken as planned");
    }

    #[test]
    fn calls_in_flight_count_until_they_end() {
        let c = config(Kind::FixedWindow, 3.0, 60_000.0);
        let mut escrow = Escrow::<8>::new(fresh_state(&c, NOW, 0.0));
        let seqs: Vec<u64> = (1..=3).map(|n| escrow.admit(&c, NOW, 1.0, false, n).seq.expect("admitted")).collect();
        assert_eq!(escrow.admit(&c, NOW, 1.0, false, 4).seq, None, "three in flight hold all three tokens");
        assert!(escrow.commit(&c, seqs[2]));
        assert_eq!(escrow.unsettled_from(), Some(1), "committed behind one in flight: not settled");
        assert!(escrow.abort(&c, seqs[0]));
        assert_eq!(escrow.unsettled_from(), Some(2));
        assert!(escrow.admit(&c, NOW, 1.0, false, 5).seq.is_some(), "the aborted call's token is back");
    }

    #[test]
    fn a_call_with_a_clock_ahead_that_aborts_leaves_nothing_behind() {
        let c = config(Kind::TokenBucket, 10.0, 1_000.0);
        let mut escrow = Escrow::<8>::new(fresh_state(&c, NOW, 0.0));
        let all = escrow.admit(&c, NOW, 10.0, false, 1).seq.expect("admitted");
        assert!(escrow.commit(&c, all));
        // A session whose clock is a second ahead sees a full bucket, and rolls back.
        let ahead = escrow.admit(&c, NOW + 1_000.0, 1.0, false, 2).seq.expect("refilled, a second on");
        assert!(escrow.abort(&c, ahead));
        assert_eq!(escrow.admit(&c, NOW, 1.0, false, 3).seq, None, "now, nothing has refilled");
    }

    #[test]
    fn a_credit_counts_only_once_committed() {
        let c = config(Kind::FixedWindow, 3.0, 60_000.0);
        let mut escrow = Escrow::<8>::new(fresh_state(&c, NOW, 0.0));
        for seq in 1..=3 {
            let taken = escrow.admit(&c, NOW, 1.0, false, seq).seq.expect("admitted");
            assert!(escrow.commit(&c, taken));
        }
        let given = escrow.credit(&c, NOW, 2.0, 4);
        assert_eq!(given.outcome.granted, -2.0, "the answer: 2 given back");
        assert_eq!(escrow.admit(&c, NOW, 1.0, false, 5).seq, None, "in flight, it helps no one");
        assert!(escrow.abort(&c, 4));
        assert_eq!(escrow.admit(&c, NOW, 1.0, false, 6).seq, None, "rolled back, it never did");
        let given = escrow.credit(&c, NOW, 2.0, 7).seq.expect("listed");
        assert!(escrow.commit(&c, given));
        assert!(escrow.admit(&c, NOW, 2.0, false, 8).seq.is_some(), "committed, its 2 are back");
        assert_eq!(escrow.credit(&c, NOW, 5.0, 9).outcome.granted, -3.0, "no more than is counted");
    }

    /// With credits: the tail is never more permissive than the committed history of debits
    /// and credits, and once every call has ended (with nothing folded from a full ring) it
    /// is that history. Small rings fill, and fold or drop what is in flight.
    #[test]
    fn credits_in_flight_never_make_the_tail_more_permissive() {
        let mut rng = StdRng::seed_from_u64(42);
        let mut folded = 0;
        for round in 0..2_000 {
            folded += usize::from(if round % 2 == 0 { credit_round::<4>(&mut rng, round) } else { credit_round::<64>(&mut rng, round) });
        }
        assert!(folded > 50, "the small rings filled ({folded} rounds)");
    }

    /// One random sequence with credits; whether anything was folded from a full ring.
    fn credit_round<const N: usize>(rng: &mut StdRng, round: usize) -> bool {
        let kind = [Kind::TokenBucket, Kind::FixedWindow, Kind::SlidingWindow][round % 3];
        let c = config(kind, f64::from(rng.gen_range(2..20)), f64::from(rng.gen_range(100..5_000)));
        let base = fresh_state(&c, NOW, 0.0);
        let mut escrow = Escrow::<N>::new(base.clone());
        let (mut now, mut seq) = (NOW, 0);
        let mut in_flight: Vec<Debit> = Vec::new();
        let mut committed: Vec<Debit> = Vec::new();
        for _ in 0..60 {
            now += f64::from(rng.gen_range(0..(c.period as u32 / 4).max(1)));
            seq += 1;
            match rng.gen_range(0..10) {
                0..=3 => {
                    let count = f64::from(rng.gen_range(1..=c.capacity as u32));
                    let admitted = escrow.admit(&c, now, count, false, seq);
                    if admitted.seq.is_some() {
                        in_flight.push(Debit { seq, at: admitted.outcome.at, count, committed: false });
                    }
                }
                4..=5 => {
                    let count = f64::from(rng.gen_range(1..=c.capacity as u32));
                    let given = escrow.credit(&c, now, count, seq);
                    if given.seq.is_some() {
                        in_flight.push(Debit { seq, at: given.outcome.at, count: -count, committed: false });
                    }
                }
                6..=7 if !in_flight.is_empty() => {
                    let debit = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                    if escrow.commit(&c, debit.seq) {
                        committed.push(debit);
                    } else if !debit.is_credit() {
                        committed.push(debit); // folded: it counts, as committed
                    }
                }
                _ if !in_flight.is_empty() => {
                    let debit = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                    if !escrow.abort(&c, debit.seq) && !debit.is_credit() {
                        committed.push(debit); // folded: its rollback gives nothing back
                    }
                }
                _ => {}
            }
            committed.sort_by_key(|d| d.seq);
            let history = committed.iter().fold(base.clone(), |s, d| apply(&s, &c, d));
            let from = escrow.admission_instant(now);
            assert!(no_more_permissive(escrow.tail(), history, &c, from), "{c:?}: more permissive than committed");
        }
        for debit in in_flight {
            if escrow.commit(&c, debit.seq) || !debit.is_credit() {
                committed.push(debit);
            }
        }
        committed.sort_by_key(|d| d.seq);
        let history = committed.iter().fold(base.clone(), |s, d| apply(&s, &c, d));
        if escrow.sunk() == 0 {
            assert_eq!(escrow.tail(), history, "{c:?}");
        } else {
            assert!(no_more_permissive(escrow.tail(), history, &c, escrow.admission_instant(now)));
        }
        escrow.sunk() > 0
    }

    /// The property the design rests on, over random interleavings of admissions, commits
    /// and aborts (in any order), with a clock that sometimes steps back or runs ahead, for
    /// every kind, with reservations (bounded or not), and with a ring small enough to fill:
    /// - exact: the committed calls, replayed one after the other at their instants as a
    ///   single-row limit would see them, are each allowed;
    /// - conservative at every step: the tail is never more permissive, at any instant of
    ///   the next two periods, than the committed history; and while nothing was sunk it is
    ///   exactly the committed history with every call still in flight;
    /// - nothing lost: once every call has ended (and none was sunk), the escrow holds the
    ///   state of the committed history, bit for bit;
    /// - the fold's bound: what is unsettled starts at the oldest call in flight.
    #[test]
    fn committed_histories_are_always_admissible_and_aborts_give_back() {
        let mut rng = StdRng::seed_from_u64(23);
        let (mut aborted, mut sunk_rounds) = (0, 0);
        for round in 0..3_000 {
            let kind = ALL_KINDS[round % 4];
            let rate = f64::from(rng.gen_range(1..20));
            let period = f64::from(rng.gen_range(100..5_000));
            let reserve_allowed = kind.can_reserve() && rng.gen_bool(0.3);
            let c = Config {
                capacity: if kind.can_reserve() { rate * f64::from(rng.gen_range(1..4)) } else { rate },
                max_reserved: (reserve_allowed && rng.gen_bool(0.7)).then(|| rate * f64::from(rng.gen_range(0..3))),
                buckets: if kind == Kind::RollingWindow { rng.gen_range(1..=20) } else { 0 },
                ..config(kind, rate, period)
            };
            let base = fresh_state(&c, NOW, 0.0);
            let (a, b) = if round % 3 == 0 {
                run::<3>(&mut rng, &c, base, reserve_allowed)
            } else {
                run::<256>(&mut rng, &c, base, reserve_allowed)
            };
            aborted += a;
            sunk_rounds += usize::from(b);
        }
        assert!(aborted > 10_000, "the sequences aborted calls ({aborted})");
        assert!(sunk_rounds > 50, "the small rings filled ({sunk_rounds} rounds)");
    }

    /// One random sequence; returns how many calls aborted and whether any debit was sunk.
    fn run<const N: usize>(rng: &mut StdRng, c: &Config, base: State, reserve_allowed: bool) -> (usize, bool) {
        let mut escrow = Escrow::<N>::new(base.clone());
        let mut now = NOW;
        let mut seq = 0;
        // (debit, reserve) of calls in flight, and of those that committed.
        let mut in_flight: Vec<(Debit, bool)> = Vec::new();
        let mut committed: Vec<(Debit, bool)> = Vec::new();
        let mut aborted = 0;
        let replay = |debits: &mut dyn Iterator<Item = &Debit>| debits.fold(base.clone(), |s, d| apply(&s, c, d));
        let step = (c.period as u32 / 4).max(1);
        for _ in 0..80 {
            now += f64::from(rng.gen_range(0..step));
            if rng.gen_bool(0.05) {
                now -= f64::from(rng.gen_range(0..step)); // the clock steps back
            }
            match rng.gen_range(0..10) {
                0..=4 => {
                    let count = f64::from(rng.gen_range(1..=(c.capacity as u32 + 1)));
                    let reserve = reserve_allowed && rng.gen_bool(0.5);
                    // Now and then a session whose clock runs ahead.
                    let at = if rng.gen_bool(0.1) { now + f64::from(rng.gen_range(0..4 * step)) } else { now };
                    seq += 1 + rng.gen_range(0..2); // numbers drawn and not used are skipped
                    let admitted = escrow.admit(c, at, count, reserve, seq);
                    assert_eq!(admitted.outcome.ok, admitted.seq.is_some(), "a call is listed exactly when it is admitted");
                    if let Some(seq) = admitted.seq {
                        in_flight.push((Debit { seq, at: admitted.outcome.at, count, committed: false }, reserve));
                    }
                }
                5..=7 if !in_flight.is_empty() => {
                    let (debit, reserve) = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                    assert!(escrow.commit(c, debit.seq) || escrow.sunk() > 0, "a listed debit is found");
                    committed.push((debit, reserve));
                }
                _ if !in_flight.is_empty() => {
                    // A rollback, or a savepoint's: the same to the escrow.
                    let (debit, _) = in_flight.swap_remove(rng.gen_range(0..in_flight.len()));
                    assert!(escrow.abort(c, debit.seq) || escrow.sunk() > 0, "a listed debit is found");
                    aborted += 1;
                }
                _ => {}
            }
            assert!(in_flight.is_empty() || !escrow.idle(), "a call in flight, listed or sunk, keeps it from a rebuild");
            committed.sort_by_key(|(d, _)| d.seq);
            let mut with_in_flight: Vec<&Debit> = committed.iter().chain(&in_flight).map(|(d, _)| d).collect();
            with_in_flight.sort_by_key(|d| d.seq);
            // Calls are admitted from here on: compared from here on.
            let from = escrow.admission_instant(now);
            let committed_only = replay(&mut committed.iter().map(|(d, _)| d));
            assert!(no_more_permissive(escrow.tail(), committed_only, c, from), "{c:?}: tail more permissive than committed");
            if escrow.sunk() == 0 {
                let latest = with_in_flight.iter().map(|d| d.at).fold(now, f64::max);
                assert_eq!(from, latest, "admitted at the latest instant of a call that has not aborted");
                assert_eq!(escrow.tail(), replay(&mut with_in_flight.into_iter()), "{c:?}: the tail is every call listed");
                let oldest = in_flight.iter().map(|(d, _)| d.seq).min();
                assert_eq!(escrow.unsettled_from(), oldest, "unsettled from the oldest call in flight");
            }
        }
        // The rest end, in random order.
        in_flight.shuffle(rng);
        for (debit, reserve) in in_flight {
            if rng.gen_bool(0.5) {
                assert!(escrow.commit(c, debit.seq) || escrow.sunk() > 0);
                committed.push((debit, reserve));
            } else {
                assert!(escrow.abort(c, debit.seq) || escrow.sunk() > 0);
                aborted += 1;
            }
        }
        committed.sort_by_key(|(d, _)| d.seq);
        let mut serial = base;
        for (debit, reserve) in &committed {
            let one = check(&serial, c, debit.at, debit.count, *reserve);
            assert!(one.ok, "{c:?}: committed call {debit:?} would be denied one at a time");
            serial = one.state();
        }
        assert!(escrow.idle(), "every call ended, sunk ones too");
        if escrow.sunk() == 0 {
            assert_eq!(escrow.tail(), serial, "{c:?}: the escrow is the committed history");
            assert_eq!(escrow.base(), serial);
            assert_eq!(escrow.unsettled_from(), None);
        } else {
            assert!(no_more_permissive(escrow.tail(), serial, c, escrow.admission_instant(now)));
        }
        (aborted, escrow.sunk() > 0)
    }
}
