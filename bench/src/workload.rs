//! The workload: a user population, its conversations, and the stream of
//! sends each client draws from it.
//!
//! - One-to-one sends go between random pairs of a fixed friend graph
//!   (every user has `friends_per_user` friends), so the conversations exist
//!   before the run, as they do in a real IM service.
//! - A fraction (`group_send_fraction`, 5% by default) of sends go to groups
//!   of `group_members` (200) members.
//! - Every recipient of a send, the sender included (their other devices
//!   must see the message), gets one sync event: the fan-out.
//!
//! Invariants: the same seed gives the same population and the same sends;
//! conversation ids of different kinds live in disjoint ranges; a member
//! list is sorted and holds no duplicate, so drivers can lock rows in order.

use rand::rngs::StdRng;
use rand::seq::index::sample;
use rand::{Rng, RngCore, SeedableRng};

pub type Uid = u64;
pub type ConvId = u64;
pub type DeviceId = u64;

/// One-to-one conversations: `DIRECT_CONV_BASE + user_index * offsets + k`.
pub const DIRECT_CONV_BASE: ConvId = 1 << 40;
/// Groups: `GROUP_CONV_BASE + group_index`.
pub const GROUP_CONV_BASE: ConvId = 2 << 40;
/// Conversations made by a scenario for itself (sync rings, long-offline).
pub const SCENARIO_CONV_BASE: ConvId = 3 << 40;
/// Users made by a scenario for itself, apart from the ingest population.
pub const SCENARIO_UID_BASE: Uid = 1 << 32;

/// Bytes of random data payloads are cut from.
const PAYLOAD_POOL_BYTES: usize = 64 << 10;

#[derive(Clone, Debug, PartialEq)]
pub struct WorkloadConfig {
    pub users: u64,
    pub friends_per_user: u32,
    pub group_members: u32,
    /// Groups in the population; `None` gives one group per
    /// `group_members` users, so a user is in about one group.
    pub groups: Option<u64>,
    pub group_send_fraction: f64,
    pub payload_bytes: usize,
}

impl Default for WorkloadConfig {
    fn default() -> Self {
        Self {
            users: 100_000,
            friends_per_user: 8,
            group_members: 200,
            groups: None,
            group_send_fraction: 0.05,
            payload_bytes: 200,
        }
    }
}

/// A conversation and its members (sorted, distinct).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversation {
    pub conv: ConvId,
    pub members: Vec<Uid>,
}

/// What a system must hold before a scenario runs.
#[derive(Clone, Debug, Default)]
pub struct Setup {
    pub convs: Vec<Conversation>,
    pub devices: Vec<(Uid, DeviceId)>,
}

/// A send prepared ahead of a measurement (a backlog), owning its members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreSend {
    pub conv: ConvId,
    pub sender: Uid,
    /// Sorted, distinct, the sender included.
    pub members: std::sync::Arc<[Uid]>,
}

/// One send as the drivers hand it to a system.
#[derive(Clone, Copy, Debug)]
pub struct Outgoing<'a> {
    pub conv: ConvId,
    pub sender: Uid,
    /// Every member that gets a sync event, the sender included; sorted.
    pub recipients: &'a [Uid],
    pub payload: &'a [u8],
    /// Unique per send of a run (the idempotency key).
    pub client_msg_id: u128,
}

/// Where a generated send goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Direct { peer: Uid },
    Group { group: u32 },
}

/// A generated send, before it borrows its recipients and payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendOp {
    pub conv: ConvId,
    pub sender: Uid,
    pub target: Target,
    payload_at: u32,
}

#[derive(Debug)]
pub struct Workload {
    config: WorkloadConfig,
    /// Friend offsets: user `u` is friends with `u ± d` (mod users).
    offsets: Vec<u64>,
    groups: Vec<Vec<Uid>>,
    payload_pool: Vec<u8>,
}

impl Workload {
    pub fn new(config: WorkloadConfig, seed: u64) -> Result<Self, String> {
        let users = config.users;
        let half_friends = u64::from(config.friends_per_user / 2).max(1);
        // Offsets are distinct and in 1..=(users-1)/2, so (u, u+d) never
        // names the same pair as (u', u'+d'): every pair has one conv id.
        let offset_space = users.saturating_sub(1) / 2;
        if offset_space < half_friends {
            return Err(format!(
                "{users} users are too few for {} friends each",
                config.friends_per_user
            ));
        }
        if users < u64::from(config.group_members) {
            return Err(format!(
                "{users} users are too few for groups of {}",
                config.group_members
            ));
        }
        if !(0.0..=1.0).contains(&config.group_send_fraction) {
            return Err("group send fraction must be within 0..=1".into());
        }
        if config.payload_bytes > PAYLOAD_POOL_BYTES / 2 {
            return Err(format!(
                "payloads are at most {} bytes",
                PAYLOAD_POOL_BYTES / 2
            ));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let offset_space_usize = usize::try_from(offset_space).unwrap_or(usize::MAX);
        let half_friends_usize = usize::try_from(half_friends).unwrap_or(usize::MAX);
        let mut offsets: Vec<u64> = sample(&mut rng, offset_space_usize, half_friends_usize)
            .into_iter()
            .map(|i| i as u64 + 1)
            .collect();
        offsets.sort_unstable();

        let group_count = config
            .groups
            .unwrap_or(users / u64::from(config.group_members).max(1))
            .max(1);
        let users_usize = usize::try_from(users).unwrap_or(usize::MAX);
        let members_usize = usize::try_from(config.group_members).unwrap_or(usize::MAX);
        let groups = (0..group_count)
            .map(|_| {
                let mut members: Vec<Uid> = sample(&mut rng, users_usize, members_usize)
                    .into_iter()
                    .map(|i| i as u64 + 1)
                    .collect();
                members.sort_unstable();
                members
            })
            .collect();
        let mut payload_pool = vec![0u8; PAYLOAD_POOL_BYTES];
        rng.fill_bytes(&mut payload_pool);
        Ok(Self {
            config,
            offsets,
            groups,
            payload_pool,
        })
    }

    pub fn groups(&self) -> &[Vec<Uid>] {
        &self.groups
    }

    /// Every conversation of the ingest population with its members.
    pub fn conversations(&self) -> Vec<Conversation> {
        let mut convs = Vec::with_capacity(self.direct_pair_count() + self.groups.len());
        for index in 0..self.config.users {
            for k in 0..self.offsets.len() {
                let (conv, a, b) = self.direct_pair(index, k);
                let mut members = vec![a, b];
                members.sort_unstable();
                convs.push(Conversation { conv, members });
            }
        }
        for (g, members) in self.groups.iter().enumerate() {
            convs.push(Conversation {
                conv: GROUP_CONV_BASE + g as u64,
                members: members.clone(),
            });
        }
        convs
    }

    pub fn direct_pair_count(&self) -> usize {
        usize::try_from(self.config.users).unwrap_or(usize::MAX) * self.offsets.len()
    }

    /// The `k`-th friendship of the user at `index` (0-based): conv id and
    /// the two uids.
    fn direct_pair(&self, index: u64, k: usize) -> (ConvId, Uid, Uid) {
        let users = self.config.users;
        let peer_index = (index + self.offsets[k]) % users;
        let conv = DIRECT_CONV_BASE + index * self.offsets.len() as u64 + k as u64;
        (conv, index + 1, peer_index + 1)
    }

    /// The members that get an event for `op`, the sender included, sorted.
    /// One-to-one sends fill `pair` and return it; group sends borrow the
    /// group's member list.
    pub fn recipients<'a>(&'a self, op: &SendOp, pair: &'a mut [Uid; 2]) -> &'a [Uid] {
        match op.target {
            Target::Direct { peer } => {
                *pair = [op.sender.min(peer), op.sender.max(peer)];
                &pair[..]
            }
            Target::Group { group } => &self.groups[group as usize],
        }
    }

    pub fn payload(&self, op: &SendOp) -> &[u8] {
        let at = op.payload_at as usize;
        &self.payload_pool[at..at + self.config.payload_bytes]
    }

    /// A payload cut at `at` (taken modulo the pool), for scenario sends.
    pub fn payload_at(&self, at: u64) -> &[u8] {
        let span = PAYLOAD_POOL_BYTES - self.config.payload_bytes;
        let at = usize::try_from(at % span as u64).unwrap_or(0);
        &self.payload_pool[at..at + self.config.payload_bytes]
    }
}

/// A client's private stream of sends.
#[derive(Debug)]
pub struct OpGen {
    rng: StdRng,
}

impl OpGen {
    pub fn new(seed: u64) -> Self {
        Self {
            rng: StdRng::seed_from_u64(seed),
        }
    }

    pub fn next_op(&mut self, workload: &Workload) -> SendOp {
        let span = PAYLOAD_POOL_BYTES - workload.config.payload_bytes;
        let payload_at = u32::try_from(self.rng.gen_range(0..span)).unwrap_or(0);
        if self.rng.gen_bool(workload.config.group_send_fraction) {
            let group = self.rng.gen_range(0..workload.groups.len());
            let members = &workload.groups[group];
            let sender = members[self.rng.gen_range(0..members.len())];
            SendOp {
                conv: GROUP_CONV_BASE + group as u64,
                sender,
                target: Target::Group {
                    group: u32::try_from(group).unwrap_or(u32::MAX),
                },
                payload_at,
            }
        } else {
            let index = self.rng.gen_range(0..workload.config.users);
            let k = self.rng.gen_range(0..workload.offsets.len());
            let (conv, a, b) = workload.direct_pair(index, k);
            // Either side of the friendship may be the one who writes.
            let (sender, peer) = if self.rng.gen_bool(0.5) {
                (a, b)
            } else {
                (b, a)
            };
            SendOp {
                conv,
                sender,
                target: Target::Direct { peer },
                payload_at,
            }
        }
    }
}

/// Users whose devices hold a backlog to sync: `users` fresh uids chatting
/// in a ring (each with the next one), every user with `devices` devices.
#[derive(Clone, Debug)]
pub struct SyncSet {
    pub users: Vec<Uid>,
    pub devices_per_user: u32,
    /// Events each user has waiting.
    pub backlog: u32,
    conv_base: ConvId,
}

impl SyncSet {
    /// `set` keeps the uids and conv ids of different sets apart.
    pub fn new(set: u32, users: u32, devices_per_user: u32, backlog: u32) -> Self {
        let uid_base = SCENARIO_UID_BASE + (u64::from(set) << 24);
        Self {
            users: (0..u64::from(users.max(2))).map(|i| uid_base + i).collect(),
            devices_per_user,
            backlog,
            conv_base: SCENARIO_CONV_BASE + (u64::from(set) << 24),
        }
    }

    /// Ring conversation `i` is between user `i` and user `i + 1`.
    fn ring_conv(&self, i: usize) -> (ConvId, Uid, Uid) {
        let next = (i + 1) % self.users.len();
        (self.conv_base + i as u64, self.users[i], self.users[next])
    }

    pub fn setup(&self) -> Setup {
        let convs = (0..self.users.len())
            .map(|i| {
                let (conv, a, b) = self.ring_conv(i);
                let mut members = vec![a, b];
                members.sort_unstable();
                Conversation { conv, members }
            })
            .collect();
        let devices = self.devices().collect();
        Setup { convs, devices }
    }

    pub fn devices(&self) -> impl Iterator<Item = (Uid, DeviceId)> + '_ {
        self.users
            .iter()
            .flat_map(|&uid| (1..=u64::from(self.devices_per_user)).map(move |d| (uid, d)))
    }

    /// The sends that build the backlog: every round, one send in every
    /// ring conversation, which gives each user two events.
    pub fn backlog_sends(&self) -> Vec<PreSend> {
        let rounds = self.backlog.div_ceil(2);
        let pairs: Vec<(ConvId, Uid, Uid, std::sync::Arc<[Uid]>)> = (0..self.users.len())
            .map(|i| {
                let (conv, a, b) = self.ring_conv(i);
                (conv, a, b, std::sync::Arc::from([a.min(b), a.max(b)]))
            })
            .collect();
        let mut sends = Vec::with_capacity(rounds as usize * self.users.len());
        for round in 0..rounds {
            for (conv, a, b, members) in &pairs {
                let sender = if round % 2 == 0 { *a } else { *b };
                sends.push(PreSend {
                    conv: *conv,
                    sender,
                    members: std::sync::Arc::clone(members),
                });
            }
        }
        sends
    }
}

/// The returning user's second device in `long-offline`: it replays the
/// same backlog as device 1 once that one is done, asking for its events'
/// ids only (no summaries).
pub const LONG_OFFLINE_BARE_DEVICE: DeviceId = 3;

/// `long-offline`: one user comes back after days away to `group_msgs`
/// messages spread over `groups` groups and `direct_msgs` one-to-one
/// messages spread over `direct_convs` conversations.
#[derive(Clone, Debug)]
pub struct LongOffline {
    pub user: Uid,
    pub convs: Vec<Conversation>,
    pub groups: usize,
    pub group_msgs: u32,
    pub direct_msgs: u32,
}

impl LongOffline {
    pub fn new(
        groups: u32,
        group_members: u32,
        group_msgs: u32,
        direct_convs: u32,
        direct_msgs: u32,
    ) -> Self {
        let base = SCENARIO_UID_BASE + (3 << 24);
        let user = base;
        let mut next_uid = base + 1;
        let mut convs = Vec::new();
        for g in 0..groups {
            let mut members = vec![user];
            for _ in 1..group_members.max(2) {
                members.push(next_uid);
                next_uid += 1;
            }
            convs.push(Conversation {
                conv: SCENARIO_CONV_BASE + (3 << 24) + u64::from(g),
                members,
            });
        }
        for d in 0..direct_convs {
            convs.push(Conversation {
                conv: SCENARIO_CONV_BASE + (3 << 24) + (1 << 20) + u64::from(d),
                members: vec![user, next_uid],
            });
            next_uid += 1;
        }
        Self {
            user,
            convs,
            groups: groups as usize,
            group_msgs,
            direct_msgs,
        }
    }

    pub fn setup(&self) -> Setup {
        Setup {
            convs: self.convs.clone(),
            devices: vec![(self.user, 1), (self.user, LONG_OFFLINE_BARE_DEVICE)],
        }
    }

    /// The days of traffic, in the order they happened: never sent by the
    /// returning user, spread round-robin over the conversations.
    pub fn sends(&self, seed: u64) -> Vec<PreSend> {
        let mut rng = StdRng::seed_from_u64(seed);
        let members: Vec<std::sync::Arc<[Uid]>> = self
            .convs
            .iter()
            .map(|c| std::sync::Arc::from(c.members.clone()))
            .collect();
        let direct = self.convs.len() - self.groups;
        let mut sends = Vec::with_capacity((self.group_msgs + self.direct_msgs) as usize);
        let total = u64::from(self.group_msgs) + u64::from(self.direct_msgs);
        let (mut g_sent, mut d_sent) = (0u32, 0u32);
        for i in 0..total {
            // Interleave the two kinds in proportion.
            let group_turn = d_sent >= self.direct_msgs
                || (g_sent < self.group_msgs
                    && u64::from(g_sent) * total <= i * u64::from(self.group_msgs));
            let index = if group_turn {
                g_sent += 1;
                (g_sent as usize - 1) % self.groups.max(1)
            } else {
                d_sent += 1;
                self.groups + (d_sent as usize - 1) % direct.max(1)
            };
            let conv = &self.convs[index];
            // Members are built sorted with the returning user first (the
            // smallest uid), so the others are everyone after it.
            let others = &conv.members[1..];
            let sender = others[rng.gen_range(0..others.len())];
            sends.push(PreSend {
                conv: conv.conv,
                sender,
                members: std::sync::Arc::clone(&members[index]),
            });
        }
        sends
    }
}

/// The soak's population: `pairs` one-to-one conversations between fresh
/// users, no user in two of them, so a client that owns a conversation
/// owns both its users and every one of their devices.
#[derive(Clone, Debug)]
pub struct SoakSet {
    pub convs: Vec<Conversation>,
    pub devices_per_user: u32,
}

impl SoakSet {
    /// `set` keeps the uids and conv ids apart from other scenarios'.
    pub fn new(set: u32, pairs: u32, devices_per_user: u32) -> Self {
        let uid_base = SCENARIO_UID_BASE + (u64::from(set) << 24);
        let conv_base = SCENARIO_CONV_BASE + (u64::from(set) << 24);
        let convs = (0..u64::from(pairs))
            .map(|i| Conversation {
                conv: conv_base + i,
                members: vec![uid_base + 2 * i, uid_base + 2 * i + 1],
            })
            .collect();
        Self {
            convs,
            devices_per_user,
        }
    }

    pub fn setup(&self) -> Setup {
        let devices = self
            .convs
            .iter()
            .flat_map(|c| c.members.iter().copied())
            .flat_map(|uid| (1..=u64::from(self.devices_per_user)).map(move |d| (uid, d)))
            .collect();
        Setup {
            convs: self.convs.clone(),
            devices,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Workload {
        let config = WorkloadConfig {
            users: 2_000,
            ..WorkloadConfig::default()
        };
        Workload::new(config, 7).expect("valid workload")
    }

    #[test]
    fn five_percent_of_sends_go_to_groups() {
        let workload = small();
        let mut gen = OpGen::new(1);
        let n = 100_000;
        let groups = (0..n)
            .filter(|_| matches!(gen.next_op(&workload).target, Target::Group { .. }))
            .count();
        let fraction = groups as f64 / f64::from(n);
        assert!((fraction - 0.05).abs() < 0.005, "group fraction {fraction}");
    }

    #[test]
    fn group_sends_fan_out_to_every_member_and_direct_sends_to_both_sides() {
        let workload = small();
        let mut gen = OpGen::new(2);
        let mut saw_group = false;
        let mut saw_direct = false;
        for _ in 0..10_000 {
            let op = gen.next_op(&workload);
            let mut pair = [0; 2];
            let recipients = workload.recipients(&op, &mut pair);
            assert!(
                recipients.contains(&op.sender),
                "the sender's devices get the event too"
            );
            assert!(
                recipients.windows(2).all(|w| w[0] < w[1]),
                "sorted and distinct"
            );
            match op.target {
                Target::Group { .. } => {
                    saw_group = true;
                    assert_eq!(recipients.len(), 200);
                }
                Target::Direct { peer } => {
                    saw_direct = true;
                    assert_ne!(peer, op.sender);
                    assert_eq!(recipients.len(), 2);
                    assert!(recipients.contains(&peer));
                }
            }
            assert!(recipients.iter().all(|&u| (1..=2_000).contains(&u)));
            assert_eq!(workload.payload(&op).len(), 200);
        }
        assert!(saw_group && saw_direct);
    }

    #[test]
    fn senders_are_spread_over_the_whole_population() {
        let workload = small();
        let mut gen = OpGen::new(3);
        let mut per_decile = [0u32; 10];
        for _ in 0..50_000 {
            let op = gen.next_op(&workload);
            per_decile[((op.sender - 1) * 10 / 2_000) as usize] += 1;
        }
        // Each tenth of the users sends about a tenth of the messages.
        for count in per_decile {
            assert!((4_000..6_000).contains(&count), "{per_decile:?}");
        }
    }

    #[test]
    fn every_direct_conversation_has_one_id_and_two_distinct_members() {
        let workload = small();
        let convs = workload.conversations();
        assert_eq!(convs.len(), 2_000 * 4 + 10);
        let mut pairs: Vec<_> = convs
            .iter()
            .filter(|c| c.conv < GROUP_CONV_BASE)
            .map(|c| c.members.clone())
            .collect();
        let total = pairs.len();
        pairs.sort();
        pairs.dedup();
        assert_eq!(
            pairs.len(),
            total,
            "a pair of friends has exactly one conversation"
        );
        assert!(convs
            .iter()
            .all(|c| c.members.windows(2).all(|w| w[0] < w[1])));
        // A generated direct send names a conversation of the population.
        let mut gen = OpGen::new(4);
        for _ in 0..1_000 {
            let op = gen.next_op(&workload);
            let mut pair = [0; 2];
            let recipients = workload.recipients(&op, &mut pair).to_vec();
            let conv = convs
                .iter()
                .find(|c| c.conv == op.conv)
                .expect("known conversation");
            assert_eq!(conv.members, recipients);
        }
    }

    #[test]
    fn same_seed_gives_same_population_and_sends() {
        let a = small();
        let b = small();
        assert_eq!(a.groups(), b.groups());
        let (mut ga, mut gb) = (OpGen::new(9), OpGen::new(9));
        for _ in 0..100 {
            assert_eq!(ga.next_op(&a), gb.next_op(&b));
        }
    }

    #[test]
    fn too_small_a_population_is_refused_with_a_reason() {
        let config = WorkloadConfig {
            users: 100,
            ..WorkloadConfig::default()
        };
        let err = Workload::new(config, 1).expect_err("100 users cannot fill a 200-member group");
        assert!(err.contains("groups of 200"), "{err}");
    }

    #[test]
    fn sync_backlog_gives_each_user_the_requested_events() {
        let set = SyncSet::new(0, 10, 3, 40);
        let mut events = std::collections::HashMap::new();
        for send in set.backlog_sends() {
            assert!(send.members.contains(&send.sender));
            for &uid in send.members.iter() {
                *events.entry(uid).or_insert(0u32) += 1;
            }
        }
        assert_eq!(events.len(), 10);
        assert!(events.values().all(|&n| n == 40), "{events:?}");
        assert_eq!(set.devices().count(), 30);
        assert_eq!(set.setup().convs.len(), 10);
    }

    #[test]
    fn long_offline_user_gets_every_group_and_direct_message_from_others() {
        let lo = LongOffline::new(4, 20, 1_000, 10, 50);
        let sends = lo.sends(1);
        assert_eq!(sends.len(), 1_050);
        assert!(sends
            .iter()
            .all(|s| s.sender != lo.user && s.members.contains(&lo.user)));
        assert!(sends
            .iter()
            .all(|s| s.members.windows(2).all(|w| w[0] < w[1])));
        let group_sends = sends.iter().filter(|s| s.members.len() == 20).count();
        assert_eq!(group_sends, 1_000);
        // The direct messages are spread through the days, not at the end.
        let first_direct = sends
            .iter()
            .position(|s| s.members.len() == 2)
            .expect("some direct");
        assert!(first_direct < 100, "{first_direct}");
        assert_eq!(
            lo.setup().devices,
            vec![(lo.user, 1), (lo.user, LONG_OFFLINE_BARE_DEVICE)]
        );
    }

    #[test]
    fn soak_conversations_share_no_user_and_every_user_has_its_devices() {
        let set = SoakSet::new(5, 100, 2);
        let mut uids: Vec<Uid> = set.convs.iter().flat_map(|c| c.members.clone()).collect();
        assert_eq!(uids.len(), 200);
        uids.sort_unstable();
        uids.dedup();
        assert_eq!(uids.len(), 200, "no user in two conversations");
        assert!(set.convs.iter().all(|c| c.members[0] < c.members[1]));
        let setup = set.setup();
        assert_eq!(setup.devices.len(), 400);
        assert!(uids.iter().all(|&u| u >= SCENARIO_UID_BASE + (5 << 24)));
        let other = SyncSet::new(4, 10, 1, 2);
        assert!(other.users.iter().all(|u| uids.binary_search(u).is_err()));
    }
}
