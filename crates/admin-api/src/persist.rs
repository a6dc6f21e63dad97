//! Keeps the configuration file in step with changes made through the
//! admin API. The file is edited as a TOML document (comments, order and
//! keys this module does not know, such as secrets, are kept), the result
//! is validated as a whole, then written to a temporary file in the same
//! directory, synced and renamed over the original (atomic on POSIX), with
//! the original's permissions.

use std::io::Write;
use std::path::Path;

use toml_edit::{value, Array, ArrayOfTables, DocumentMut, InlineTable, Item, Table};

use server::config::{BackendKind, CacheConfig, Config, CredConfig, LunConfig, TargetConfig};
use server::control_acl::ChapScope;

/// An edit that cannot be made to the file.
pub type EditError = String;

/// Parses the configuration file's text.
pub fn parse(text: &str) -> Result<DocumentMut, EditError> {
    text.parse::<DocumentMut>().map_err(|e| e.to_string())
}

fn targets(doc: &mut DocumentMut) -> Result<&mut ArrayOfTables, EditError> {
    doc.get_mut("target")
        .and_then(Item::as_array_of_tables_mut)
        .ok_or_else(|| "the configuration file has no [[target]]".to_string())
}

fn target<'a>(doc: &'a mut DocumentMut, name: &str) -> Result<&'a mut Table, EditError> {
    targets(doc)?
        .iter_mut()
        .find(|t| t.get("name").and_then(Item::as_str) == Some(name))
        .ok_or_else(|| format!("target {name} is not in the configuration file"))
}

/// Writes `number = position` into every LUN of the target that has none,
/// so that removing one does not renumber the others at the next start.
fn pin_numbers(t: &mut Table) -> Option<&mut ArrayOfTables> {
    let luns = t.get_mut("lun").and_then(Item::as_array_of_tables_mut)?;
    for (i, l) in luns.iter_mut().enumerate() {
        if l.get("number").is_none() {
            l.insert("number", value(i as i64));
        }
    }
    Some(luns)
}

fn number_of(l: &Table) -> Option<i64> {
    l.get("number").and_then(Item::as_integer)
}

/// Adds LUN `n` described by `c` to target `name`.
pub fn add_lun(doc: &mut DocumentMut, name: &str, n: u16, c: &LunConfig) -> Result<(), EditError> {
    let t = target(doc, name)?;
    if t.get("lun").is_none() {
        t.insert("lun", Item::ArrayOfTables(ArrayOfTables::new()));
    }
    let luns = pin_numbers(t).ok_or("target.lun is not an array of tables")?;
    luns.push(lun_table(n, c));
    Ok(())
}

/// Adds target `c` (its LUNs numbered, no credentials: the admin API sets
/// those with their own calls).
pub fn add_target(doc: &mut DocumentMut, c: &TargetConfig) -> Result<(), EditError> {
    if doc.get("target").is_none() {
        doc.insert("target", Item::ArrayOfTables(ArrayOfTables::new()));
    }
    let ts = targets(doc)?;
    if ts
        .iter()
        .any(|t| t.get("name").and_then(Item::as_str) == Some(c.name.as_str()))
    {
        return Err(format!(
            "target {} is in the configuration file already",
            c.name
        ));
    }
    let mut t = Table::new();
    t.insert("name", value(c.name.as_str()));
    if let Some(a) = &c.alias {
        t.insert("alias", value(a.as_str()));
    }
    if let Some(n) = &c.nqn {
        t.insert("nqn", value(n.as_str()));
    }
    for (k, list) in [
        ("allow", &c.allow),
        ("allow_net", &c.allow_net),
        ("nvme_allow", &c.nvme_allow),
    ] {
        if !list.is_empty() {
            t.insert(k, value(list.iter().map(String::as_str).collect::<Array>()));
        }
    }
    if c.max_sessions != 0 {
        t.insert("max_sessions", value(c.max_sessions as i64));
    }
    if let Some(d) = &c.dhchap {
        // Files only: the API takes no inline secret.
        let mut dt = InlineTable::new();
        for (k, f) in [
            ("secret_file", &d.secret_file),
            ("ctrl_secret_file", &d.ctrl_secret_file),
        ] {
            if let Some(f) = f {
                dt.insert(k, f.display().to_string().into());
            }
        }
        t.insert("dhchap", value(dt));
    }
    let mut luns = ArrayOfTables::new();
    for (i, l) in c.lun.iter().enumerate() {
        luns.push(lun_table(l.number.unwrap_or(i as u16), l));
    }
    t.insert("lun", Item::ArrayOfTables(luns));
    ts.push(t);
    Ok(())
}

/// Removes target `name`.
pub fn remove_target(doc: &mut DocumentMut, name: &str) -> Result<(), EditError> {
    let ts = targets(doc)?;
    let i = ts
        .iter()
        .position(|t| t.get("name").and_then(Item::as_str) == Some(name))
        .ok_or_else(|| format!("target {name} is not in the configuration file"))?;
    ts.remove(i);
    if ts.is_empty() {
        doc.remove("target");
    }
    Ok(())
}

/// LUN `n` described by `c`, as a `[[target.lun]]` table.
fn lun_table(n: u16, c: &LunConfig) -> Table {
    let mut l = Table::new();
    l.insert(
        "backend",
        value(match c.backend {
            BackendKind::Mem => "mem",
            BackendKind::Null => "null",
            BackendKind::File => "file",
            BackendKind::Rbd => "rbd",
        }),
    );
    if let Some(p) = &c.path {
        l.insert("path", value(p.display().to_string()));
    }
    for (k, v) in [
        ("pool", &c.pool),
        ("image", &c.image),
        ("ceph_client", &c.ceph_client),
    ] {
        if let Some(v) = v {
            l.insert(k, value(v.as_str()));
        }
    }
    for (k, v) in [
        ("ceph_conf", &c.ceph_conf),
        ("ceph_keyring", &c.ceph_keyring),
    ] {
        if let Some(v) = v {
            l.insert(k, value(v.display().to_string()));
        }
    }
    if let Some(s) = &c.size {
        l.insert("size", value(s.as_str()));
    }
    if let Some(u) = &c.uuid {
        l.insert("uuid", value(u.as_str()));
    }
    if c.block_size != 512 {
        l.insert("block_size", value(i64::from(c.block_size)));
    }
    if let Some(p) = c.physical_block_size {
        l.insert("physical_block_size", value(i64::from(p)));
    }
    if c.write_cache == CacheConfig::Back {
        l.insert("write_cache", value("back"));
    }
    if c.read_only {
        l.insert("read_only", value(true));
    }
    if !c.thin {
        l.insert("thin", value(false));
    }
    if let Some(s) = &c.serial {
        l.insert("serial", value(s.as_str()));
    }
    l.insert("number", value(i64::from(n)));
    l
}

/// Sets `key` of `t` to `v`, keeping the comment and spacing around the
/// value it replaces (`allow = []   # nobody yet` keeps its comment).
fn replace(t: &mut Table, key: &str, mut v: toml_edit::Value) {
    if let Some(old) = t.get(key).and_then(Item::as_value) {
        *v.decor_mut() = old.decor().clone();
    }
    t.insert(key, Item::Value(v));
}

/// Removes LUN `n` from target `name`.
pub fn remove_lun(doc: &mut DocumentMut, name: &str, n: u16) -> Result<(), EditError> {
    let t = target(doc, name)?;
    let luns = pin_numbers(t).ok_or_else(|| format!("target {name} has no LUN {n} in the file"))?;
    let i = luns
        .iter()
        .position(|l| number_of(l) == Some(i64::from(n)))
        .ok_or_else(|| format!("target {name} has no LUN {n} in the file"))?;
    luns.remove(i);
    Ok(())
}

/// Sets the size of LUN `n` of target `name`.
pub fn resize_lun(doc: &mut DocumentMut, name: &str, n: u16, size: &str) -> Result<(), EditError> {
    let t = target(doc, name)?;
    let luns = pin_numbers(t).ok_or_else(|| format!("target {name} has no LUN {n} in the file"))?;
    let l = luns
        .iter_mut()
        .find(|l| number_of(l) == Some(i64::from(n)))
        .ok_or_else(|| format!("target {name} has no LUN {n} in the file"))?;
    replace(l, "size", size.into());
    Ok(())
}

/// Sets target `name`'s `allow` (initiator names) and `allow_net`
/// (networks); an empty list is removed from the file (empty means any).
pub fn set_acl(
    doc: &mut DocumentMut,
    name: &str,
    initiators: &[String],
    networks: &[String],
) -> Result<(), EditError> {
    let t = target(doc, name)?;
    for (key, list) in [("allow", initiators), ("allow_net", networks)] {
        if list.is_empty() {
            t.remove(key);
        } else {
            let mut a = Array::new();
            list.iter().for_each(|v| a.push(v.as_str()));
            replace(t, key, a.into());
        }
    }
    Ok(())
}

/// Sets (or with `None` removes) the `chap` or `mutual_chap` (`key`)
/// credential of a target or of `[discovery]`, as an inline table with the
/// secret or the secret file as given. Removing `chap` removes
/// `mutual_chap` too.
pub fn set_chap(
    doc: &mut DocumentMut,
    scope: ChapScope<'_>,
    key: &str,
    cred: Option<&CredConfig>,
) -> Result<(), EditError> {
    let t = match scope {
        ChapScope::Target(name) => target(doc, name)?,
        ChapScope::Discovery => {
            if doc.get("discovery").is_none() {
                doc.insert("discovery", Item::Table(Table::new()));
            }
            doc.get_mut("discovery")
                .and_then(Item::as_table_mut)
                .ok_or("discovery is not a table")?
        }
    };
    match cred {
        None => {
            t.remove(key);
            if key == "chap" {
                t.remove("mutual_chap");
            }
            if scope == ChapScope::Discovery && t.is_empty() {
                doc.remove("discovery");
            }
        }
        Some(c) => {
            let mut it = InlineTable::new();
            it.insert("user", c.user.as_str().into());
            if let Some(s) = &c.secret {
                it.insert("secret", s.0.as_str().into());
            }
            if let Some(f) = &c.secret_file {
                it.insert("secret_file", f.display().to_string().into());
            }
            replace(t, key, it.into());
        }
    }
    Ok(())
}

/// The `listen` array, created with the default address (what an absent
/// key means) when the file has none.
fn listen_array(doc: &mut DocumentMut) -> Result<&mut Array, EditError> {
    if doc.get("listen").is_none() {
        let mut a = Array::new();
        a.push(server::config::DEFAULT_LISTEN);
        doc.insert("listen", value(a));
    }
    Ok(doc
        .get_mut("listen")
        .and_then(Item::as_array_mut)
        .ok_or("listen is not an array")?)
}

/// Checks that `key[index]` of the file is `addr` (an entry with port 0
/// matches any port: it was bound to one the system chose).
fn check_entry(
    list: &Array,
    key: &str,
    index: usize,
    addr: std::net::SocketAddr,
) -> Result<(), EditError> {
    let entry: Option<std::net::SocketAddr> = list
        .get(index)
        .and_then(|v| v.as_str())
        .and_then(|v| v.parse().ok());
    match entry {
        Some(e) if e == addr || (e.port() == 0 && e.ip() == addr.ip()) => Ok(()),
        _ => Err(format!(
            "the configuration file's {key}[{index}] is not {addr}: the file is out of step"
        )),
    }
}

/// Appends NVMe/TCP port `addr` to `nvme_listen`.
pub fn add_nvme_port(doc: &mut DocumentMut, addr: &str) -> Result<(), EditError> {
    if doc.get("nvme_listen").is_none() {
        doc.insert("nvme_listen", value(Array::new()));
    }
    doc.get_mut("nvme_listen")
        .and_then(Item::as_array_mut)
        .ok_or("nvme_listen is not an array")?
        .push(addr);
    Ok(())
}

/// Removes the NVMe/TCP port at `index` (from 0) of `nvme_listen`, whose
/// address is `addr` (an entry with port 0 matches any port).
pub fn remove_nvme_port(
    doc: &mut DocumentMut,
    index: usize,
    addr: std::net::SocketAddr,
) -> Result<(), EditError> {
    let list = doc
        .get_mut("nvme_listen")
        .and_then(Item::as_array_mut)
        .ok_or("the configuration file has no nvme_listen")?;
    check_entry(list, "nvme_listen", index, addr)?;
    list.remove(index);
    Ok(())
}

/// Appends portal `addr` to `listen` (writing the default portal first when
/// the file relied on it), in ALUA group `group` when groups are listed
/// (a new group when there is none with that id).
pub fn add_portal(
    doc: &mut DocumentMut,
    addr: &str,
    position: u16,
    group: u16,
) -> Result<(), EditError> {
    let listen = listen_array(doc)?;
    listen.push(addr);
    if let Some(groups) = doc
        .get_mut("alua")
        .and_then(|a| a.get_mut("group"))
        .and_then(Item::as_array_of_tables_mut)
    {
        if groups.is_empty() {
            return Ok(());
        }
        let found = groups
            .iter()
            .position(|g| g.get("id").and_then(Item::as_integer) == Some(i64::from(group)));
        match found.and_then(|i| groups.get_mut(i)) {
            Some(g) => g
                .get_mut("portals")
                .and_then(Item::as_array_mut)
                .ok_or("alua.group.portals is not an array")?
                .push(i64::from(position)),
            None => {
                // A group of its own, active/optimized.
                let mut g = Table::new();
                g.insert("id", value(i64::from(group)));
                let mut p = Array::new();
                p.push(i64::from(position));
                g.insert("portals", value(p));
                groups.push(g);
            }
        }
    }
    Ok(())
}

/// Removes the portal at `index` (from 0) of `listen`, whose address is
/// `addr` (an entry with port 0 matches any port: it was bound to one the
/// OS chose). The positions of ALUA group members after it move down by
/// one; a group left without portals is removed.
pub fn remove_portal(
    doc: &mut DocumentMut,
    index: usize,
    addr: std::net::SocketAddr,
) -> Result<(), EditError> {
    let listen = listen_array(doc)?;
    check_entry(listen, "listen", index, addr)?;
    listen.remove(index);
    let position = i64::try_from(index + 1).map_err(|e| e.to_string())?;
    if let Some(groups) = doc
        .get_mut("alua")
        .and_then(|a| a.get_mut("group"))
        .and_then(Item::as_array_of_tables_mut)
    {
        for g in groups.iter_mut() {
            let ports = g
                .get_mut("portals")
                .and_then(Item::as_array_mut)
                .ok_or("alua.group.portals is not an array")?;
            let kept: Vec<i64> = ports
                .iter()
                .filter_map(|v| v.as_integer())
                .filter(|&p| p != position)
                .map(|p| if p > position { p - 1 } else { p })
                .collect();
            let mut a = Array::new();
            kept.into_iter().for_each(|p| a.push(p));
            *ports = a;
        }
        groups.retain(|g| {
            g.get("portals")
                .and_then(Item::as_array)
                .is_some_and(|a| !a.is_empty())
        });
    }
    Ok(())
}

/// An ALUA group as the file should have it: id, state name, and the
/// positions (in `listen`, from 1) of its portals.
pub type GroupState = (u16, String, Vec<u16>);

/// Sets the state of every ALUA group to `states`; when the file lists no
/// groups, writes them all out (the default layout is one group per
/// portal, with the portals' positions as members).
pub fn set_alua(doc: &mut DocumentMut, states: &[GroupState]) -> Result<(), EditError> {
    if doc.get("alua").is_none() {
        doc.insert("alua", Item::Table(Table::new()));
    }
    let alua = doc
        .get_mut("alua")
        .and_then(Item::as_table_mut)
        .ok_or("alua is not a table")?;
    let empty = alua
        .get("group")
        .and_then(Item::as_array_of_tables)
        .is_none_or(ArrayOfTables::is_empty);
    if empty {
        let mut groups = ArrayOfTables::new();
        for (id, state, positions) in states {
            let mut g = Table::new();
            g.insert("id", value(i64::from(*id)));
            let mut p = Array::new();
            positions.iter().for_each(|&x| p.push(i64::from(x)));
            g.insert("portals", value(p));
            g.insert("state", value(state.as_str()));
            groups.push(g);
        }
        alua.insert("group", Item::ArrayOfTables(groups));
        return Ok(());
    }
    let groups = alua
        .get_mut("group")
        .and_then(Item::as_array_of_tables_mut)
        .ok_or("alua.group is not an array of tables")?;
    for g in groups.iter_mut() {
        let id = g.get("id").and_then(Item::as_integer);
        if let Some((_, s, _)) = states.iter().find(|(i, _, _)| Some(i64::from(*i)) == id) {
            replace(g, "state", s.as_str().into());
        }
    }
    Ok(())
}

/// Checks that `doc` is a valid configuration.
pub fn validate(doc: &DocumentMut) -> Result<Config, EditError> {
    Config::from_toml(&doc.to_string()).map_err(|e| e.to_string())
}

/// Replaces `path` with `text` atomically (temporary file, fsync, rename,
/// fsync of the directory), keeping the original's permissions.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "config".into());
    let tmp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let res = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        if let Ok(m) = std::fs::metadata(path) {
            f.set_permissions(m.permissions())?;
        }
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"# my SAN
listen = ["127.0.0.1:3260"]

[[target]]
name = "iqn.2026-11.x:a"   # the main one
[[target.lun]]
backend = "mem"
size = "1M"
[[target.lun]]
backend = "mem"
size = "2M"
"#;

    fn lun(size: &str) -> LunConfig {
        let mut l = LunConfig::from_spec(&format!("mem:{size}")).unwrap();
        l.number = None;
        l
    }

    #[test]
    fn add_remove_resize_keep_numbers_and_comments() {
        let mut d = parse(FILE).unwrap();
        add_lun(&mut d, "iqn.2026-11.x:a", 5, &lun("4M")).unwrap();
        remove_lun(&mut d, "iqn.2026-11.x:a", 0).unwrap();
        resize_lun(&mut d, "iqn.2026-11.x:a", 1, "8M").unwrap();
        let text = d.to_string();
        assert!(text.contains("# my SAN"));
        assert!(text.contains("# the main one"));
        let c = validate(&d).unwrap();
        let l = &c.target[0].lun;
        assert_eq!(l.len(), 2);
        assert_eq!((l[0].number, l[0].size.as_deref()), (Some(1), Some("8M")));
        assert_eq!((l[1].number, l[1].size.as_deref()), (Some(5), Some("4M")));
        assert!(remove_lun(&mut d, "iqn.2026-11.x:a", 0).is_err());
        assert!(add_lun(&mut d, "iqn.2026-11.x:nope", 0, &lun("1M")).is_err());
        // Two LUNs with one number: the whole file is refused.
        add_lun(&mut d, "iqn.2026-11.x:a", 5, &lun("4M")).unwrap();
        assert!(validate(&d).is_err());
    }

    #[test]
    fn physical_block_size_is_written() {
        let mut d = parse(FILE).unwrap();
        let mut l = lun("4M");
        l.physical_block_size = Some(4096);
        add_lun(&mut d, "iqn.2026-11.x:a", 7, &l).unwrap();
        assert!(d.to_string().contains("physical_block_size = 4096"));
        let c = validate(&d).unwrap();
        let got = c.target[0]
            .lun
            .iter()
            .find(|l| l.number == Some(7))
            .unwrap();
        assert_eq!(got.physical_block_size, Some(4096));
    }

    #[test]
    fn an_rbd_lun_is_written_whole() {
        let mut d = parse(FILE).unwrap();
        let mut l = LunConfig::from_spec("rbd:pool1/img1").unwrap();
        l.ceph_conf = Some("/etc/ceph/c.conf".into());
        l.ceph_client = Some("client.gw".into());
        l.ceph_keyring = Some("/etc/ceph/k".into());
        add_lun(&mut d, "iqn.2026-11.x:a", 7, &l).unwrap();
        let c = validate(&d).unwrap();
        let back = c.target[0]
            .lun
            .iter()
            .find(|x| x.number == Some(7))
            .unwrap();
        l.number = Some(7);
        assert_eq!(back, &l);
    }

    #[test]
    fn portals_and_alua() {
        let mut d = parse(FILE).unwrap();
        add_portal(&mut d, "127.0.0.1:3261", 2, 2).unwrap();
        set_alua(
            &mut d,
            &[
                (1, "active-optimized".into(), vec![1]),
                (2, "standby".into(), vec![2]),
            ],
        )
        .unwrap();
        let c = validate(&d).unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.alua.group.len(), 2);
        assert_eq!(
            c.alua.group[1].state,
            server::config::AluaStateConfig::Standby
        );
        // With groups listed, a new portal joins the named group.
        add_portal(&mut d, "127.0.0.1:3262", 3, 1).unwrap();
        let c = validate(&d).unwrap();
        assert_eq!(c.alua.group[0].portals, vec![1, 3]);
        set_alua(&mut d, &[(2, "unavailable".into(), vec![])]).unwrap();
        assert_eq!(
            validate(&d).unwrap().alua.group[1].state,
            server::config::AluaStateConfig::Unavailable
        );
        // ... or a group of its own.
        add_portal(&mut d, "127.0.0.1:3263", 4, 9).unwrap();
        let c = validate(&d).unwrap();
        assert_eq!(
            (c.alua.group[2].id, c.alua.group[2].portals.clone()),
            (9, vec![4])
        );
    }

    #[test]
    fn replaced_values_keep_their_comments() {
        let text = "listen = [\"127.0.0.1:3260\"]\n[[target]]\n# the target\nname = \"iqn.2026-11.x:a\"\nallow = []   # nobody listed yet\nchap = { user = \"u\", secret = \"0123456789ab\" }   # rotate yearly\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"   # grows\nnumber = 0\n";
        let mut d = parse(text).unwrap();
        set_acl(&mut d, "iqn.2026-11.x:a", &["iqn.2026-11.x:h".into()], &[]).unwrap();
        let chap = CredConfig::from_spec("v:abcdefghijkl").unwrap();
        set_chap(
            &mut d,
            ChapScope::Target("iqn.2026-11.x:a"),
            "chap",
            Some(&chap),
        )
        .unwrap();
        resize_lun(&mut d, "iqn.2026-11.x:a", 0, "2M").unwrap();
        let out = d.to_string();
        for c in [
            "# the target",
            "# nobody listed yet",
            "# rotate yearly",
            "# grows",
        ] {
            assert!(out.contains(c), "{c:?} lost:\n{out}");
        }
        assert!(
            out.contains("allow = [\"iqn.2026-11.x:h\"]   # nobody listed yet"),
            "{out}"
        );
        assert!(out.contains("size = \"2M\"   # grows"), "{out}");
        validate(&d).unwrap();
    }

    #[test]
    fn acl_and_chap() {
        let mut d = parse(FILE).unwrap();
        let a = "iqn.2026-11.x:host1".to_string();
        set_acl(
            &mut d,
            "iqn.2026-11.x:a",
            std::slice::from_ref(&a),
            &["10.0.0.0/8".into()],
        )
        .unwrap();
        let chap = CredConfig::from_spec("host1:host1-secret-1").unwrap();
        set_chap(
            &mut d,
            ChapScope::Target("iqn.2026-11.x:a"),
            "chap",
            Some(&chap),
        )
        .unwrap();
        let mutual = CredConfig::from_spec("disk:target-secret-2").unwrap();
        set_chap(
            &mut d,
            ChapScope::Target("iqn.2026-11.x:a"),
            "mutual_chap",
            Some(&mutual),
        )
        .unwrap();
        let c = validate(&d).unwrap();
        let t = &c.target[0];
        assert_eq!(t.allow, vec![a]);
        assert_eq!(t.allow_net, vec!["10.0.0.0/8".to_string()]);
        assert_eq!(t.chap.as_ref(), Some(&chap));
        assert_eq!(t.mutual_chap.as_ref(), Some(&mutual));
        assert!(d.to_string().contains("# the main one"));
        // Equal secrets both ways: the file as a whole is refused.
        let same = CredConfig::from_spec("disk:host1-secret-1").unwrap();
        let mut bad = d.clone();
        set_chap(
            &mut bad,
            ChapScope::Target("iqn.2026-11.x:a"),
            "mutual_chap",
            Some(&same),
        )
        .unwrap();
        assert!(validate(&bad).is_err());
        // Clearing chap clears mutual_chap; empty lists leave the file.
        set_chap(&mut d, ChapScope::Target("iqn.2026-11.x:a"), "chap", None).unwrap();
        set_acl(&mut d, "iqn.2026-11.x:a", &[], &[]).unwrap();
        let c = validate(&d).unwrap();
        let t = &c.target[0];
        assert!(t.chap.is_none() && t.mutual_chap.is_none());
        assert!(t.allow.is_empty() && t.allow_net.is_empty());
        assert!(!d.to_string().contains("allow"));
        // Discovery: a [discovery] table appears.
        set_chap(&mut d, ChapScope::Discovery, "chap", Some(&chap)).unwrap();
        assert_eq!(validate(&d).unwrap().discovery.chap.as_ref(), Some(&chap));
        set_chap(&mut d, ChapScope::Discovery, "chap", None).unwrap();
        assert!(validate(&d).unwrap().discovery.chap.is_none());
        assert!(
            !d.to_string().contains("[discovery]"),
            "an empty table goes"
        );
    }

    #[test]
    fn portal_removal_renumbers_group_members() {
        let mut d = parse(FILE).unwrap();
        add_portal(&mut d, "127.0.0.1:3261", 2, 2).unwrap();
        add_portal(&mut d, "127.0.0.1:3262", 3, 3).unwrap();
        set_alua(
            &mut d,
            &[
                (1, "active-optimized".into(), vec![1]),
                (2, "standby".into(), vec![2]),
                (3, "active-optimized".into(), vec![3]),
            ],
        )
        .unwrap();
        let a = |s: &str| s.parse().unwrap();
        assert!(remove_portal(&mut d, 1, a("127.0.0.1:9999")).is_err());
        remove_portal(&mut d, 1, a("127.0.0.1:3261")).unwrap();
        let c = validate(&d).unwrap();
        assert_eq!(c.listen, vec![a("127.0.0.1:3260"), a("127.0.0.1:3262")]);
        let g: Vec<_> = c
            .alua
            .group
            .iter()
            .map(|g| (g.id, g.portals.clone()))
            .collect();
        assert_eq!(g, vec![(1, vec![1]), (3, vec![2])], "group 2 is gone");
        // Port 0 in the file matches the port the OS chose.
        let mut d = parse("listen = [\"127.0.0.1:0\", \"127.0.0.1:0\"]\n[[target]]\nname = \"iqn.2026-11.x:a\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n").unwrap();
        remove_portal(&mut d, 0, a("127.0.0.1:40000")).unwrap();
        assert_eq!(validate(&d).unwrap().listen.len(), 1);
    }

    #[test]
    fn default_listen_is_written_out() {
        let mut d = parse("[[target]]\nname = \"iqn.2026-11.x:a\"\n[[target.lun]]\nbackend = \"mem\"\nsize = \"1M\"\n").unwrap();
        add_portal(&mut d, "127.0.0.1:3999", 2, 2).unwrap();
        let c = validate(&d).unwrap();
        assert_eq!(c.listen.len(), 2);
        assert_eq!(c.listen[0].to_string(), server::config::DEFAULT_LISTEN);
    }

    #[test]
    fn atomic_write_replaces_and_keeps_mode() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "old").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        write_atomic(&p, "new").unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "new");
        assert_eq!(
            std::fs::metadata(&p).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
