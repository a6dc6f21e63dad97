//! The ALUA side of the multipath engine, as `scsi_dh_alua` and
//! dm-multipath do it: which paths may carry I/O given the target port
//! groups' states, and what to do when no path may.
//!
//! Pure logic over the paths' groups and the last REPORT TARGET PORT
//! GROUPS answer; the engine sends the commands and keeps the clock.
//!
//! ```text
//!                 I/O sense 04/0A..0C, 2A/06, 29/xx, 3F/0E,
//!                 a failed path, or no usable path
//!   +---------+ ------------------------------------------> +-------+
//!   |  Ready  |                                             | Stale |<--+
//!   +---------+ <--- RTPG: a live path's group is active ---+-------+   |
//!        ^                                    | after its backoff       |
//!        |                                    v                         |
//!        |                               +---------+  no active group:  |
//!        +----------- active ----------- | Reading |  transitioning or  |
//!                                        +---------+  no STPG -> backoff +
//!                                             | standby/unavailable group,
//!                                             v explicit ALUA
//!                                       +------------+
//!                                       | Activating | -- STPG answered -> Stale
//!                                       +------------+    (re-read at once)
//! ```

use std::collections::HashMap;
use std::time::Duration;

use initiator::scsi::{AluaState, TpgDescriptor};

/// Shortest wait before re-reading the states of a group in transition or
/// one the target is expected to activate on its own.
pub const BACKOFF_MIN: Duration = Duration::from_millis(10);
/// Longest such wait.
pub const BACKOFF_MAX: Duration = Duration::from_millis(50);

/// A path as the ALUA logic sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathView {
    /// The connection is up.
    pub live: bool,
    /// Its target port group (VPD 0x83, designator type 5h).
    pub tpg: Option<u16>,
    /// Its relative target port (designator type 4h).
    pub rel_port: Option<u16>,
}

/// The target port groups as last reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Groups {
    /// Group id -> its state and relative target ports.
    groups: HashMap<u16, (AluaState, Vec<u16>)>,
}

impl Groups {
    /// From REPORT TARGET PORT GROUPS data.
    pub fn from_rtpg(d: &[TpgDescriptor]) -> Groups {
        Groups {
            groups: d
                .iter()
                .map(|g| (g.id, (g.state, g.ports.clone())))
                .collect(),
        }
    }

    /// The group of a path: its TPG designator, else the group listing its
    /// relative port; `None` when the target reports neither.
    pub fn group_of(&self, p: &PathView) -> Option<u16> {
        if let Some(t) = p.tpg {
            return Some(t);
        }
        let r = p.rel_port?;
        self.groups
            .iter()
            .find(|(_, (_, ports))| ports.contains(&r))
            .map(|(id, _)| *id)
    }

    /// The state of a path's group. A path whose group the target knows
    /// but no longer reports (every port of it removed) is `Offline`; a
    /// path that names no group at all is taken as active/non-optimized
    /// (nothing says otherwise).
    pub fn state_of(&self, p: &PathView) -> AluaState {
        match self.group_of(p) {
            Some(id) => self.groups.get(&id).map_or(AluaState::Offline, |(s, _)| *s),
            None => AluaState::ActiveNonOptimized,
        }
    }
}

/// The preference class of a state: 0 active/optimized, 1 active/non-
/// optimized (and logical-block dependent), `None` for states that get no
/// I/O (standby, unavailable, offline, transitioning).
pub fn tier(s: AluaState) -> Option<u8> {
    match s {
        AluaState::ActiveOptimized => Some(0),
        AluaState::ActiveNonOptimized | AluaState::LbaDependent => Some(1),
        _ => None,
    }
}

/// The best tier among live paths, or `None` when no live path is active.
pub fn best_tier(paths: &[PathView], g: &Groups) -> Option<u8> {
    paths
        .iter()
        .filter(|p| p.live)
        .filter_map(|p| tier(g.state_of(p)))
        .min()
}

/// Which paths may carry I/O: the live ones of the best tier.
pub fn usable(paths: &[PathView], g: &Groups) -> Vec<bool> {
    let best = best_tier(paths, g);
    paths
        .iter()
        .map(|p| p.live && best.is_some() && tier(g.state_of(p)) == best)
        .collect()
}

/// What to do after reading the groups' states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Some live path is active: send I/O.
    Ready,
    /// Send SET TARGET PORT GROUPS through `path` to make `tpg`
    /// active/optimized.
    Activate { path: usize, tpg: u16 },
    /// Nothing to do but wait and read the states again (a transition is
    /// under way, or the target must activate a group on its own).
    Wait,
}

/// The step after an RTPG answer. `stpg`: the target supports explicit
/// ALUA and has not refused SET TARGET PORT GROUPS.
pub fn decide(paths: &[PathView], g: &Groups, stpg: bool) -> Next {
    if best_tier(paths, g).is_some() {
        return Next::Ready;
    }
    let live = || paths.iter().enumerate().filter(|(_, p)| p.live);
    if live().any(|(_, p)| g.state_of(p) == AluaState::Transitioning) {
        return Next::Wait;
    }
    if !stpg {
        return Next::Wait;
    }
    for want in [AluaState::Standby, AluaState::Unavailable] {
        if let Some((i, p)) = live().find(|(_, p)| g.state_of(p) == want) {
            if let Some(tpg) = g.group_of(p) {
                return Next::Activate { path: i, tpg };
            }
        }
    }
    Next::Wait
}

/// The wait after `n` consecutive waits: doubling from [`BACKOFF_MIN`] up
/// to [`BACKOFF_MAX`].
pub fn backoff(n: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(1u32 << n.min(8))
        .min(BACKOFF_MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use AluaState::*;

    fn path(live: bool, tpg: u16) -> PathView {
        PathView {
            live,
            tpg: Some(tpg),
            rel_port: Some(tpg),
        }
    }

    fn groups(s: &[(u16, AluaState)]) -> Groups {
        Groups::from_rtpg(
            &s.iter()
                .map(|&(id, state)| TpgDescriptor {
                    preferred: false,
                    state,
                    id,
                    status: 0,
                    ports: vec![id],
                })
                .collect::<Vec<_>>(),
        )
    }

    #[test]
    fn only_the_best_live_tier_gets_io() {
        let p = [path(true, 1), path(true, 2), path(true, 3)];
        let g = groups(&[(1, ActiveOptimized), (2, Standby), (3, ActiveOptimized)]);
        assert_eq!(usable(&p, &g), [true, false, true]);
        let g = groups(&[(1, ActiveNonOptimized), (2, Standby), (3, ActiveOptimized)]);
        assert_eq!(usable(&p, &g), [false, false, true]);
        // The optimized path is down: the non-optimized one takes over.
        let down = [path(true, 1), path(true, 2), path(false, 3)];
        assert_eq!(usable(&down, &g), [true, false, false]);
        // Nothing active: no I/O anywhere.
        let g = groups(&[(1, Unavailable), (2, Standby), (3, Transitioning)]);
        assert_eq!(usable(&p, &g), [false, false, false]);
        assert_eq!(best_tier(&p, &g), None);
        // A group no longer reported (its portal removed) gets no I/O.
        let g = groups(&[(2, ActiveOptimized)]);
        assert_eq!(usable(&p, &g), [false, true, false]);
    }

    #[test]
    fn groups_found_by_designator_or_relative_port() {
        let g = groups(&[(1, ActiveOptimized), (2, Standby)]);
        let by_port = PathView {
            live: true,
            tpg: None,
            rel_port: Some(2),
        };
        assert_eq!(g.group_of(&by_port), Some(2));
        assert_eq!(g.state_of(&by_port), Standby);
        let anonymous = PathView {
            live: true,
            tpg: None,
            rel_port: None,
        };
        assert_eq!(g.state_of(&anonymous), ActiveNonOptimized);
        // An optimized path is preferred to one that says nothing.
        let p = [anonymous, path(true, 1)];
        assert_eq!(usable(&p, &g), [false, true]);
    }

    #[test]
    fn failover_decisions() {
        let p = [path(false, 1), path(true, 2)];
        // The active path is gone, the other one is standby: activate it
        // with explicit ALUA, else wait for the target.
        let g = groups(&[(1, ActiveOptimized), (2, Standby)]);
        assert_eq!(decide(&p, &g, true), Next::Activate { path: 1, tpg: 2 });
        assert_eq!(decide(&p, &g, false), Next::Wait);
        // Unavailable is activated too, standby first.
        let p3 = [path(false, 1), path(true, 2), path(true, 3)];
        let g = groups(&[(1, ActiveOptimized), (2, Unavailable), (3, Standby)]);
        assert_eq!(decide(&p3, &g, true), Next::Activate { path: 2, tpg: 3 });
        // A transition under way: wait, never STPG over it.
        let g = groups(&[(1, Unavailable), (2, Transitioning), (3, Standby)]);
        assert_eq!(decide(&p3, &g, true), Next::Wait);
        // A live active path: go on.
        let g = groups(&[(1, Standby), (2, ActiveNonOptimized)]);
        assert_eq!(decide(&p, &g, true), Next::Ready);
        // Only offline groups: nothing to activate.
        let g = groups(&[(2, Offline)]);
        assert_eq!(decide(&p, &g, true), Next::Wait);
    }

    #[test]
    fn backoff_is_bounded() {
        assert_eq!(backoff(0), BACKOFF_MIN);
        assert_eq!(backoff(1), Duration::from_millis(20));
        assert_eq!(backoff(2), Duration::from_millis(40));
        assert_eq!(backoff(3), BACKOFF_MAX);
        assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
    }
}
