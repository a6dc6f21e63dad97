//! Changing a running server: LUNs, portals and ALUA states (what the admin
//! API calls), and reading its statistics. Access rules (ACLs, CHAP) are
//! in [`crate::control_acl`].
//!
//! Every change is safe with sessions connected: a LUN table change is a
//! new immutable table (connections pick it up at their next batch of
//! PDUs, commands already running keep the LU they started on), removed
//! LUNs answer LOGICAL UNIT NOT SUPPORTED, and the sessions learn of the
//! change through unit attentions: REPORTED LUNS DATA HAS CHANGED (3F/0E)
//! after an addition or removal, CAPACITY DATA HAS CHANGED (2A/09) after a
//! resize, ASYMMETRIC ACCESS STATE CHANGED (2A/06) after an ALUA change.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use scsi::{AccessState, Asc, LogicalUnit};
use serde::Serialize;
use thiserror::Error;
use tokio::net::TcpListener;
use volume::access::GroupSpec;

use crate::config::{LunConfig, TargetConfig};
use crate::lunmap::{build_lu, TargetRt};
use crate::server::{install_abort_hook, install_target_abort_hooks, Portal, Shared};
use crate::stats::Snapshot;

/// Why a change was refused.
#[derive(Debug, Error)]
pub enum ControlError {
    /// The target, LUN or group named does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The change contradicts the current state (a LUN number in use).
    #[error("{0}")]
    Conflict(String),
    /// The request is invalid or the backend refused it.
    #[error("{0}")]
    Invalid(String),
}

/// A LUN as the API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct LunView {
    pub lun: u16,
    /// `naa.` followed by 32 hex digits, as hosts name the device.
    pub naa: String,
    pub serial: String,
    pub product: String,
    pub block_size: u32,
    pub blocks: u64,
    pub size_bytes: u64,
    pub read_only: bool,
    pub thin: bool,
    /// `ready`, or `opening` while its storage is opened in the background
    /// (served NOT READY, becoming ready, meanwhile).
    pub state: &'static str,
    /// Attempts to open it so far (`opening` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// Why the last attempt failed (`opening` only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A target as the API shows it.
#[derive(Clone, Debug, Serialize)]
pub struct TargetView {
    pub name: String,
    /// Its NVMe subsystem NQN.
    pub nqn: String,
    pub alias: Option<String>,
    pub luns: Vec<LunView>,
    pub alua: Vec<AluaView>,
}

/// One ALUA target port group.
#[derive(Clone, Debug, Serialize)]
pub struct AluaView {
    pub group: u16,
    pub state: String,
}

/// A portal.
#[derive(Clone, Debug, Serialize)]
pub struct PortalView {
    pub addr: String,
    pub tpgt: u16,
    pub alua_group: u16,
}

/// An NVMe/TCP port.
#[derive(Clone, Debug, Serialize)]
pub struct NvmePortView {
    /// Its port ID (PORTID of the discovery log), from 1.
    pub id: u16,
    pub addr: String,
    /// The ALUA group whose state is the ANA state through it.
    pub alua_group: u16,
}

/// The admin handle of a running server ([`crate::Server::control`]).
#[derive(Clone)]
pub struct Control {
    pub(crate) shared: Arc<Shared>,
}

impl std::fmt::Debug for Control {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Control").finish_non_exhaustive()
    }
}

/// `naa.` and the designator's 32 hex digits, as hosts name the device.
fn naa_name(naa: &[u8; 16]) -> String {
    let hex: String = naa.iter().map(|b| format!("{b:02x}")).collect();
    format!("naa.{hex}")
}

fn lun_view(n: u16, lu: &LogicalUnit) -> LunView {
    let id = lu.volume().identity();
    LunView {
        lun: n,
        naa: naa_name(&id.naa),
        serial: id.serial.clone(),
        product: id.product.clone(),
        block_size: lu.block_size(),
        blocks: lu.num_blocks(),
        size_bytes: lu.num_blocks() * u64::from(lu.block_size()),
        read_only: lu.volume().read_only(),
        thin: lu.thin(),
        state: "ready",
        attempts: None,
        last_error: None,
    }
}

/// The view of LUN `n` becoming ready: its identity, no blocks yet.
fn pending_view(n: u16, p: &crate::opening::PendingLu) -> LunView {
    let id = p.unit.identity();
    LunView {
        lun: n,
        naa: naa_name(&id.naa),
        serial: id.serial.clone(),
        product: id.product.clone(),
        block_size: p.block_size,
        blocks: 0,
        size_bytes: 0,
        read_only: p.read_only,
        thin: false,
        state: "opening",
        attempts: Some(p.progress.attempts()),
        last_error: p.progress.last_error(),
    }
}

impl Control {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Control { shared }
    }

    /// The admission and CHAP throttle counters.
    pub fn admission_counters(&self) -> Arc<crate::admission::AdmissionCounters> {
        self.shared.access.counters.clone()
    }

    /// `NotFound` unless target `name` exists.
    pub fn target_exists(&self, name: &str) -> Result<(), ControlError> {
        self.target(name).map(|_| ())
    }

    fn target(&self, name: &str) -> Result<Arc<TargetRt>, ControlError> {
        self.shared
            .target(name)
            .ok_or_else(|| ControlError::NotFound(format!("no target {name}")))
    }

    /// Every target with its LUNs and ALUA states.
    pub fn targets(&self) -> Vec<TargetView> {
        self.shared
            .all_targets()
            .iter()
            .map(|t| TargetView {
                name: t.name.clone(),
                nqn: t.nqn.clone(),
                alias: t.alias.clone(),
                luns: {
                    let luns = t.luns();
                    let mut v: Vec<LunView> = luns.iter().map(|(n, lu)| lun_view(n, lu)).collect();
                    v.extend(luns.pending.iter().map(|(n, p)| pending_view(*n, p)));
                    v.sort_by_key(|l| l.lun);
                    v
                },
                alua: t
                    .port_groups
                    .states()
                    .into_iter()
                    // A group whose portals were all removed is gone.
                    .filter(|(g, _)| !t.port_groups.ports_of(*g).is_empty())
                    .map(|(g, s)| AluaView {
                        group: g,
                        state: s.name().to_string(),
                    })
                    .collect(),
            })
            .collect()
    }

    /// Adds target `cfg` while the server runs: its LUNs are opened (a
    /// backend that cannot be opened refuses the whole target), it takes
    /// the server's ALUA groups as they are now, and it is served at once
    /// through every portal (SendTargets lists it) and, unless it requires
    /// CHAP, as an NVMe subsystem through every NVMe/TCP port (the
    /// discovery log lists it).
    pub fn add_target(&self, cfg: &TargetConfig) -> Result<TargetView, ControlError> {
        self.refuse_target_change_on_gateway()?;
        cfg.validate()
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let nqn = cfg.subsystem_nqn();
        {
            let ts = self.shared.targets.read();
            if ts.iter().any(|t| t.name == cfg.name) {
                return Err(ControlError::Conflict(format!(
                    "target {} exists",
                    cfg.name
                )));
            }
            if ts.iter().any(|t| t.nqn == nqn) {
                return Err(ControlError::Conflict(format!(
                    "NQN {nqn} is another target's"
                )));
            }
        }
        let rules = crate::access::TargetAccess::from_config(cfg)
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let groups: Vec<GroupSpec> = self
            .shared
            .groups
            .groups()
            .map(|g| GroupSpec {
                id: g.id(),
                ports: g.ports(),
                state: g.state(),
                preferred: g.preferred(),
            })
            .collect();
        let t = TargetRt::build(
            cfg,
            groups,
            self.shared.groups.is_explicit(),
            self.shared.state_dir.as_deref(),
            None,
        )
        .map_err(ControlError::Invalid)?;
        let t = Arc::new(t);
        install_target_abort_hooks(&self.shared, &t);
        {
            let mut ts = self.shared.targets.write();
            // Checked again under the lock: two requests may race.
            if ts.iter().any(|o| o.name == t.name || o.nqn == t.nqn) {
                return Err(ControlError::Conflict(format!(
                    "target {} exists",
                    cfg.name
                )));
            }
            self.shared.access.add_target(&cfg.name, rules);
            ts.push(t.clone());
        }
        crate::nvme::register_target(&self.shared, cfg, &t);
        tracing::info!(target = %cfg.name, nqn = %nqn, luns = cfg.lun.len(), "target added");
        Ok(self
            .targets()
            .into_iter()
            .find(|v| v.name == cfg.name)
            .expect("the target was just added"))
    }

    /// Removes target `name` while the server runs: it leaves SendTargets
    /// and the NVMe discovery log, new logins and Connects to it are
    /// refused, and its iSCSI sessions and NVMe/TCP controllers end (their
    /// connections close); commands already running on its LUs finish.
    pub fn remove_target(&self, name: &str) -> Result<(), ControlError> {
        self.refuse_target_change_on_gateway()?;
        let t = {
            let mut ts = self.shared.targets.write();
            let i = ts
                .iter()
                .position(|t| t.name == name)
                .ok_or_else(|| ControlError::NotFound(format!("no target {name}")))?;
            if ts.len() == 1 {
                return Err(ControlError::Conflict(
                    "the last target cannot be removed: add another first".into(),
                ));
            }
            self.shared.access.remove_target(name);
            ts.remove(i)
        };
        self.shared.nvme.registry.remove(&t.nqn);
        let mut ended = 0;
        for (k, e) in self.shared.registry.lock().iter() {
            if k.target == name {
                e.kill.notify_one();
                ended += 1;
            }
        }
        tracing::info!(target = %name, sessions = ended, "target removed");
        Ok(())
    }

    /// Every portal.
    pub fn portals(&self) -> Vec<PortalView> {
        self.shared
            .portals
            .read()
            .iter()
            .map(|p| PortalView {
                addr: p.addr.to_string(),
                tpgt: p.tpgt,
                alua_group: p.alua_group,
            })
            .collect()
    }

    /// The lowest LUN number target `name` does not use.
    pub fn free_lun(&self, name: &str) -> Result<u16, ControlError> {
        let t = self.luns_of(name)?;
        (0..=255u16)
            .find(|n| !t.in_use(*n))
            .ok_or_else(|| ControlError::Conflict("all 256 LUN numbers are in use".into()))
    }

    fn luns_of(&self, name: &str) -> Result<Arc<crate::lunmap::LunTable>, ControlError> {
        Ok(self.target(name)?.luns())
    }

    /// Opens the backend of a new LUN `n` of target `name` without serving
    /// it yet (so the configuration file can be written first).
    pub fn build_lun(
        &self,
        name: &str,
        n: u16,
        cfg: &LunConfig,
    ) -> Result<Arc<LogicalUnit>, ControlError> {
        let t = self.target(name)?;
        if n > 255 {
            return Err(ControlError::Invalid("LUN numbers are 0..=255".into()));
        }
        refuse_on_gateway(&t)?;
        if t.luns().in_use(n) {
            return Err(ControlError::Conflict(format!("LUN {n} exists")));
        }
        build_lu(
            &t.name,
            usize::from(n),
            cfg,
            &t.port_groups,
            t.state_dir.as_deref(),
            true,
        )
        .map_err(|e| ControlError::Invalid(e.msg))
    }

    /// Serves `lu` (from [`Control::build_lun`]) as LUN `n` of `name`.
    pub fn install_lun(
        &self,
        name: &str,
        n: u16,
        lu: Arc<LogicalUnit>,
    ) -> Result<LunView, ControlError> {
        let t = self.target(name)?;
        if t.luns().in_use(n) {
            return Err(ControlError::Conflict(format!("LUN {n} exists")));
        }
        install_abort_hook(&self.shared, &t.name, n, &lu);
        let view = lun_view(n, &lu);
        t.install(n, Some(lu));
        inventory_changed(&t);
        tracing::info!(target = %t.name, lun = n, "LUN added");
        Ok(view)
    }

    /// Checks that LUN `n` of `name` exists (ready or becoming ready).
    pub fn lun(&self, name: &str, n: u16) -> Result<LunView, ControlError> {
        let t = self.target(name)?;
        let luns = t.luns();
        luns.luns
            .get(usize::from(n))
            .and_then(Option::as_ref)
            .map(|lu| lun_view(n, lu))
            .or_else(|| luns.pending_number(n).map(|p| pending_view(n, p)))
            .ok_or_else(|| ControlError::NotFound(format!("{name} has no LUN {n}")))
    }

    /// Stops serving LUN `n` of `name`: new commands get LOGICAL UNIT NOT
    /// SUPPORTED, commands already running finish.
    pub fn remove_lun(&self, name: &str, n: u16) -> Result<(), ControlError> {
        self.lun(name, n)?;
        let t = self.target(name)?;
        refuse_on_gateway(&t)?;
        t.install(n, None);
        inventory_changed(&t);
        tracing::info!(target = %t.name, lun = n, "LUN removed");
        Ok(())
    }

    /// Resizes LUN `n` of `name` to `bytes`. Growing works on every
    /// backend that can change size (file, mem, null); shrinking cuts off
    /// data, so it needs `shrink` and is done only on RAM and null LUNs
    /// (scratch space by definition; the memory past the new end is
    /// freed), never on a file or device LUN.
    pub fn resize_lun(
        &self,
        name: &str,
        n: u16,
        bytes: u64,
        shrink: bool,
    ) -> Result<LunView, ControlError> {
        let t = self.target(name)?;
        let lu = t
            .luns()
            .luns
            .get(usize::from(n))
            .and_then(Option::clone)
            .ok_or_else(|| ControlError::NotFound(format!("{name} has no LUN {n}")))?;
        let now = lu.num_blocks() * u64::from(lu.block_size());
        if bytes < now {
            let kind = lu.backend_kind();
            if !matches!(kind, "mem" | "null") {
                return Err(ControlError::Invalid(format!(
                    "LUN {n} has {now} bytes: shrinking a {kind} LUN would cut off user data; only growing is allowed"
                )));
            }
            if !shrink {
                return Err(ControlError::Invalid(format!(
                    "LUN {n} has {now} bytes: shrinking loses the data past {bytes} bytes; say \"shrink\": true (--shrink) to mean it"
                )));
            }
        }
        if bytes != now {
            lu.resize(bytes).map_err(ControlError::Invalid)?;
            tracing::info!(target = %t.name, lun = n, bytes, "LUN resized");
        }
        Ok(lun_view(n, &lu))
    }

    /// Sets ALUA target port group `group` to `state` on every target.
    pub fn set_alua(&self, group: u16, state: AccessState) -> Result<(), ControlError> {
        let mut found = false;
        if !self.shared.gateway_mode {
            // What targets added later start from.
            found |= self.shared.groups.set_state(group, state).is_some();
        }
        for t in self.shared.all_targets() {
            if t.gateway.is_some() {
                return Err(ControlError::Invalid(
                    "the ALUA states of a gateway follow the images' locks (SET TARGET PORT \
                     GROUPS moves them)"
                        .into(),
                ));
            }
            match t.port_groups.set_state(group, state) {
                None => {}
                Some(changed) => {
                    found = true;
                    if changed {
                        t.luns().iter().for_each(|(_, lu)| {
                            lu.unit_attention_all(Asc::ASYMMETRIC_ACCESS_STATE_CHANGED)
                        });
                    }
                }
            }
        }
        if !found {
            return Err(ControlError::NotFound(format!(
                "no ALUA target port group {group}"
            )));
        }
        tracing::info!(group, state = state.name(), "ALUA state set");
        Ok(())
    }

    /// A gateway's targets are in every peer's configuration: adding or
    /// removing one on one gateway only would make them differ.
    fn refuse_target_change_on_gateway(&self) -> Result<(), ControlError> {
        if self.shared.gateway_mode {
            return Err(ControlError::Invalid(
                "this process is a gateway: its targets are in every peer's configuration; \
                 change them there and restart"
                    .into(),
            ));
        }
        Ok(())
    }

    /// A gateway's portals are its ALUA group's ports, which every peer's
    /// configuration lists: changing them on one gateway only would make
    /// REPORT TARGET PORT GROUPS differ between paths.
    fn refuse_portal_change_on_gateway(&self) -> Result<(), ControlError> {
        if self.shared.gateway_mode {
            return Err(ControlError::Invalid(
                "this process is a gateway: its portals are listed in every peer's configuration; \
                 change them there and restart"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Binds a new portal on `addr` in ALUA group `alua_group` (default:
    /// its own, id = its group tag) and starts accepting on it. Joining a
    /// configured group adds the port to it (REPORT TARGET PORT GROUPS
    /// lists it, and it takes the group's state). An address whose portal
    /// was removed while the server runs gets that portal's tag and (unless
    /// another is named) ALUA group back: the same target port returns,
    /// and hosts' paths through it resume as they were.
    pub async fn add_portal(
        &self,
        addr: SocketAddr,
        alua_group: Option<u16>,
    ) -> Result<PortalView, ControlError> {
        self.refuse_portal_change_on_gateway()?;
        if self.shared.portals.read().iter().any(|p| p.addr == addr) {
            return Err(ControlError::Conflict(format!(
                "{addr} is a portal already"
            )));
        }
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| ControlError::Invalid(format!("cannot listen on {addr}: {e}")))?;
        let bound = l
            .local_addr()
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let portal = {
            let mut ps = self.shared.portals.write();
            let mut removed = self.shared.removed_portals.lock();
            let before = removed
                .iter()
                .position(|r| r.addr == bound && !ps.iter().any(|p| p.tpgt == r.tpgt))
                .map(|i| removed.remove(i));
            let p = match before {
                Some(r) => Portal {
                    addr: bound,
                    tpgt: r.tpgt,
                    alua_group: alua_group.unwrap_or(r.alua_group),
                    nvme: false,
                },
                None => {
                    let tpgt = self
                        .shared
                        .next_tpgt
                        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |t| t.checked_add(1))
                        .map_err(|_| {
                            ControlError::Conflict(
                                "no portal group tags left: restart the target".into(),
                            )
                        })?;
                    Portal {
                        addr: bound,
                        tpgt,
                        alua_group: alua_group.unwrap_or(tpgt),
                        nvme: false,
                    }
                }
            };
            ps.push(p);
            p
        };
        let template = [self.shared.groups.clone()];
        let targets = self.shared.all_targets();
        for g in template
            .iter()
            .chain(targets.iter().map(|t| &t.port_groups))
        {
            // Into the group named, or a new one of its own.
            if !g.add_port(portal.alua_group, portal.tpgt) {
                g.add_group(portal.alua_group, portal.tpgt, AccessState::ActiveOptimized);
            }
        }
        self.shared.add_portal_stop(portal.tpgt);
        self.shared
            .new_portals
            .send((l, portal))
            .map_err(|_| ControlError::Invalid("the server is stopping".into()))?;
        Ok(PortalView {
            addr: portal.addr.to_string(),
            tpgt: portal.tpgt,
            alua_group: portal.alua_group,
        })
    }

    /// The position (from 0, as in the configuration's `listen`) and
    /// description of the portal `key` names: its group tag or its address.
    pub fn find_portal(&self, key: &str) -> Result<(usize, PortalView), ControlError> {
        let ps = self.shared.portals.read();
        let found = match key.parse::<u16>() {
            Ok(tag) => ps.iter().position(|p| p.tpgt == tag),
            Err(_) => {
                let addr: SocketAddr = key.parse().map_err(|_| {
                    ControlError::Invalid(format!(
                        "{key:?}: name a portal by its group tag or its address (ip:port)"
                    ))
                })?;
                ps.iter().position(|p| p.addr == addr)
            }
        };
        let i = found.ok_or_else(|| ControlError::NotFound(format!("no portal {key}")))?;
        let p = ps[i];
        Ok((
            i,
            PortalView {
                addr: p.addr.to_string(),
                tpgt: p.tpgt,
                alua_group: p.alua_group,
            },
        ))
    }

    /// Removes portal `tpgt`: SendTargets stops listing it at once, it
    /// stops listening, its port leaves its ALUA group (a group left
    /// without ports is no longer reported), and its connections finish
    /// the commands they have in flight and close, as at shutdown (their
    /// initiators reconnect through another portal). The last portal
    /// cannot be removed.
    pub fn remove_portal(&self, tpgt: u16) -> Result<PortalView, ControlError> {
        self.refuse_portal_change_on_gateway()?;
        let p = {
            let mut ps = self.shared.portals.write();
            let i = ps
                .iter()
                .position(|p| p.tpgt == tpgt)
                .ok_or_else(|| ControlError::NotFound(format!("no portal {tpgt}")))?;
            if ps.len() == 1 {
                return Err(ControlError::Conflict(
                    "the last portal cannot be removed: add another first".into(),
                ));
            }
            ps.remove(i)
        };
        self.shared.groups.remove_port(tpgt);
        for t in self.shared.all_targets() {
            t.port_groups.remove_port(tpgt);
        }
        self.shared.removed_portals.lock().push(p);
        self.shared.stop_portal(tpgt);
        tracing::info!(addr = %p.addr, tpgt, "portal removed");
        Ok(PortalView {
            addr: p.addr.to_string(),
            tpgt: p.tpgt,
            alua_group: p.alua_group,
        })
    }

    /// Every NVMe/TCP port, in order (as `nvme_listen`).
    pub fn nvme_ports(&self) -> Vec<NvmePortView> {
        let groups = self.shared.nvme_groups.lock().clone();
        self.shared
            .nvme
            .ports
            .read()
            .iter()
            .map(|p| NvmePortView {
                id: p.id,
                addr: p.addr.to_string(),
                alua_group: groups.get(&p.id).copied().unwrap_or(1),
            })
            .collect()
    }

    /// Binds a new NVMe/TCP port on `addr` and starts accepting on it; the
    /// discovery log lists it at once. Its port ID is the lowest free one,
    /// and its ANA state is that of the ALUA group of the iSCSI portal at
    /// its position in `nvme_listen` (the last portal beyond them), as
    /// at start.
    pub async fn add_nvme_port(&self, addr: SocketAddr) -> Result<NvmePortView, ControlError> {
        self.refuse_portal_change_on_gateway()?;
        if self.shared.nvme.ports.read().iter().any(|p| p.addr == addr)
            || self.shared.portals.read().iter().any(|p| p.addr == addr)
        {
            return Err(ControlError::Conflict(format!("{addr} is a port already")));
        }
        let l = TcpListener::bind(addr)
            .await
            .map_err(|e| ControlError::Invalid(format!("cannot listen on {addr}: {e}")))?;
        let bound = l
            .local_addr()
            .map_err(|e| ControlError::Invalid(e.to_string()))?;
        let (id, group) = {
            let mut ports = self.shared.nvme.ports.write();
            let id = (1..crate::server::NVME_PORT_TAGS)
                .find(|i| !ports.iter().any(|p| p.id == *i))
                .ok_or_else(|| ControlError::Conflict("no NVMe port IDs left".into()))?;
            let position = ports.len() + 1;
            let group = {
                let ps = self.shared.portals.read();
                ps.get(position.min(ps.len()).max(1) - 1)
                    .map_or(1, |p| p.alua_group)
            };
            ports.push(nvme::admin::Port { id, addr: bound });
            (id, group)
        };
        self.shared.nvme_groups.lock().insert(id, group);
        self.shared.nvme.registry.ports_changed();
        let portal = Portal {
            addr: bound,
            tpgt: crate::server::NVME_PORT_TAGS + id - 1,
            alua_group: group,
            nvme: true,
        };
        self.shared.add_portal_stop(portal.tpgt);
        self.shared
            .new_portals
            .send((l, portal))
            .map_err(|_| ControlError::Invalid("the server is stopping".into()))?;
        tracing::info!(addr = %bound, id, alua_group = group, "NVMe/TCP port added");
        Ok(NvmePortView {
            id,
            addr: bound.to_string(),
            alua_group: group,
        })
    }

    /// The position (from 0, as in `nvme_listen`) and description of the
    /// NVMe/TCP port `key` names: its port ID or its address.
    pub fn find_nvme_port(&self, key: &str) -> Result<(usize, NvmePortView), ControlError> {
        let ports = self.nvme_ports();
        let i = match key.parse::<u16>() {
            Ok(id) => ports.iter().position(|p| p.id == id),
            Err(_) => {
                let addr: SocketAddr = key.parse().map_err(|_| {
                    ControlError::Invalid(format!(
                        "{key:?}: name an NVMe/TCP port by its ID or its address (ip:port)"
                    ))
                })?;
                ports.iter().position(|p| p.addr == addr.to_string())
            }
        }
        .ok_or_else(|| ControlError::NotFound(format!("no NVMe/TCP port {key}")))?;
        Ok((i, ports[i].clone()))
    }

    /// Removes NVMe/TCP port `id`: the discovery log stops listing it at
    /// once, it stops listening, and its connections finish the commands
    /// in flight and close (hosts with other paths go on through them).
    pub fn remove_nvme_port(&self, id: u16) -> Result<NvmePortView, ControlError> {
        self.refuse_portal_change_on_gateway()?;
        let p = {
            let mut ports = self.shared.nvme.ports.write();
            let i = ports
                .iter()
                .position(|p| p.id == id)
                .ok_or_else(|| ControlError::NotFound(format!("no NVMe/TCP port {id}")))?;
            ports.remove(i)
        };
        let group = self.shared.nvme_groups.lock().remove(&id).unwrap_or(1);
        self.shared.nvme.registry.ports_changed();
        self.shared
            .stop_portal(crate::server::NVME_PORT_TAGS + id - 1);
        tracing::info!(addr = %p.addr, id, "NVMe/TCP port removed");
        Ok(NvmePortView {
            id,
            addr: p.addr.to_string(),
            alua_group: group,
        })
    }

    /// Everything counted so far.
    pub fn stats(&self) -> Snapshot {
        self.shared.stats.snapshot()
    }
}

/// Tells every session of `t` that the LUN inventory changed.
fn inventory_changed(t: &TargetRt) {
    t.luns()
        .iter()
        .for_each(|(_, lu)| lu.unit_attention_all(Asc::REPORTED_LUNS_DATA_CHANGED));
}

/// Gateways serve the same LUNs as their peers, from their configuration
/// files: a LUN added or removed on one only would be a different LU
/// behind the same identity.
fn refuse_on_gateway(t: &TargetRt) -> Result<(), ControlError> {
    if t.gateway.is_some() {
        return Err(ControlError::Invalid(format!(
            "{} is served by several gateways: change its LUNs in every gateway's \
             configuration and restart them",
            t.name
        )));
    }
    Ok(())
}
