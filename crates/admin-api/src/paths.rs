//! Which files the admin API may make the server open (docs/ADMIN.md
//! "Trust model"). The operator's own command line and configuration file
//! are trusted; a request through the API is not, since the server usually
//! runs as root. So a LUN added through the API may only name a path under
//! `lun_roots` and, unless `api_existing_files` says otherwise, only a file
//! it creates itself (never one it did not: that would let the caller read
//! or overwrite it over iSCSI); a `secret_file` (or an RBD LUN's
//! `ceph_conf`/`ceph_keyring`) only a file under `secret_roots`. Symlinks
//! are resolved before the check. Refusals name the rule, never whether a
//! file exists or how long it is.

use std::fs::OpenOptions;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use server::config::{BackendKind, Config, LunConfig};

/// The roots and the rule on existing files.
#[derive(Clone, Debug, Default)]
pub struct PathPolicy {
    /// Canonical directories a LUN may lie under.
    pub lun_roots: Vec<PathBuf>,
    /// Canonical directories a secret (or Ceph) file may lie under.
    pub secret_roots: Vec<PathBuf>,
    /// Existing regular files under `lun_roots` may be opened and grown.
    pub existing_files: bool,
}

/// A file created for a LUN being added; removed again unless kept.
#[derive(Debug)]
pub struct Created(Option<PathBuf>);

impl Created {
    /// The LUN is in service: the file stays.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for Created {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl PathPolicy {
    /// The policy of `cfg`, with `admin_dir` for the defaults: `lun_roots`
    /// default to `<admin_dir>/luns` (created, mode 0700) and the
    /// directories of the configuration's file LUNs that are regular files
    /// (never a block device's directory, which would open every device);
    /// `secret_roots` to `<admin_dir>`, `/etc/ceph` and the directories of
    /// the files the configuration names.
    pub fn from_config(cfg: &Config, admin_dir: &Path) -> PathPolicy {
        let a = &cfg.admin;
        let lun_roots = match &a.lun_roots {
            Some(r) => r.clone(),
            None => {
                let own = admin_dir.join("luns");
                let _ = crate::auth::ensure_dir(&own);
                let mut r = vec![own];
                for l in cfg.target.iter().flat_map(|t| &t.lun) {
                    if l.backend != BackendKind::File {
                        continue;
                    }
                    let Some(p) = &l.path else { continue };
                    let regular = std::fs::metadata(p).is_ok_and(|m| m.file_type().is_file());
                    if let (true, Some(d)) = (regular, p.parent()) {
                        r.push(d.to_path_buf());
                    }
                }
                r
            }
        };
        let secret_roots = match &a.secret_roots {
            Some(r) => r.clone(),
            None => {
                let mut r = vec![admin_dir.to_path_buf(), PathBuf::from("/etc/ceph")];
                let auths = cfg
                    .target
                    .iter()
                    .flat_map(|t| [&t.chap, &t.mutual_chap])
                    .chain([&cfg.discovery.chap, &cfg.discovery.mutual_chap]);
                for c in auths.flatten() {
                    r.extend(
                        c.secret_file
                            .as_deref()
                            .and_then(Path::parent)
                            .map(Path::to_path_buf),
                    );
                }
                for l in cfg.target.iter().flat_map(|t| &t.lun) {
                    for f in [&l.ceph_conf, &l.ceph_keyring].into_iter().flatten() {
                        r.extend(f.parent().map(Path::to_path_buf));
                    }
                }
                r
            }
        };
        let canon = |v: Vec<PathBuf>| {
            let mut out: Vec<PathBuf> = v
                .iter()
                .filter_map(|p| std::fs::canonicalize(p).ok())
                .filter(|p| p != Path::new("/"))
                .collect();
            out.sort();
            out.dedup();
            out
        };
        PathPolicy {
            lun_roots: canon(lun_roots),
            secret_roots: canon(secret_roots),
            existing_files: a.api_existing_files,
        }
    }

    fn roots_text(roots: &[PathBuf]) -> String {
        if roots.is_empty() {
            return "none".into();
        }
        roots
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }

    fn lun_refusal(&self) -> String {
        let what = if self.existing_files {
            "a file or block device"
        } else {
            "a new file (with a size) or a block device"
        };
        format!(
            "refused by the LUN path policy: through the admin API a LUN must be {what} under lun_roots ({})",
            Self::roots_text(&self.lun_roots)
        )
    }

    /// Checks a LUN to be added through the API, and creates its file when
    /// it is a new one (exclusively, never through a symlink). The
    /// returned guard removes that file unless the LUN goes into service.
    pub fn admit_lun(&self, l: &mut LunConfig) -> Result<Created, String> {
        match l.backend {
            BackendKind::Mem | BackendKind::Null => return Ok(Created(None)),
            BackendKind::Rbd => {
                for f in [&l.ceph_conf, &l.ceph_keyring].into_iter().flatten() {
                    self.secret_path(f).map_err(|_| {
                        format!(
                            "refused by the secret path policy: through the admin API ceph_conf and ceph_keyring must lie under secret_roots ({})",
                            Self::roots_text(&self.secret_roots)
                        )
                    })?;
                }
                return Ok(Created(None));
            }
            BackendKind::File => {}
        }
        let path = l.path.clone().ok_or("a file LUN needs a path")?;
        let refuse = || self.lun_refusal();
        let (dir, name) = split_plain(&path).ok_or_else(refuse)?;
        let dir = std::fs::canonicalize(dir).map_err(|_| refuse())?;
        if !self.lun_roots.iter().any(|r| dir.starts_with(r)) {
            return Err(refuse());
        }
        let candidate = dir.join(name);
        // Where the name leads, symlinks resolved; it must stay under a root.
        let resolved = match std::fs::canonicalize(&candidate) {
            Ok(r) => Some(r),
            Err(_) if std::fs::symlink_metadata(&candidate).is_ok() => return Err(refuse()),
            Err(_) => None,
        };
        match resolved {
            Some(r) => {
                if !under(&r, &self.lun_roots) {
                    return Err(refuse());
                }
                let ft = std::fs::metadata(&r).map_err(|_| refuse())?.file_type();
                let ok = ft.is_block_device() || (ft.is_file() && self.existing_files);
                if !ok {
                    return Err(refuse());
                }
                l.path = Some(r);
                Ok(Created(None))
            }
            None => {
                if l.size.is_none() {
                    return Err(refuse());
                }
                OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .custom_flags(libc::O_NOFOLLOW)
                    .open(&candidate)
                    .map_err(|e| format!("{}: {e}", candidate.display()))?;
                l.path = Some(candidate.clone());
                Ok(Created(Some(candidate)))
            }
        }
    }

    /// The canonical path of a secret file named through the API, if it is
    /// a regular file under `secret_roots`; one refusal for every reason.
    pub fn secret_path(&self, p: &Path) -> Result<PathBuf, String> {
        let refuse = || {
            format!(
                "refused by the secret path policy: through the admin API a secret_file must be a readable file under secret_roots ({}) whose first line is a 12..=255-byte secret",
                Self::roots_text(&self.secret_roots)
            )
        };
        if !p.is_absolute() {
            return Err(refuse());
        }
        let r = std::fs::canonicalize(p).map_err(|_| refuse())?;
        if !under(&r, &self.secret_roots) || !std::fs::metadata(&r).is_ok_and(|m| m.is_file()) {
            return Err(refuse());
        }
        Ok(r)
    }

    /// The refusal of a secret file that is under the roots but unusable
    /// (unreadable, or its secret of the wrong length): the same words.
    pub fn secret_refusal(&self) -> String {
        self.secret_path(Path::new("")).unwrap_err()
    }
}

/// An absolute path's directory and plain last component (no `..`).
fn split_plain(p: &Path) -> Option<(&Path, &std::ffi::OsStr)> {
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return None;
    }
    match p.components().next_back()? {
        Component::Normal(n) => Some((p.parent()?, n)),
        _ => None,
    }
}

/// Whether `p` lies strictly inside one of `roots`.
fn under(p: &Path, roots: &[PathBuf]) -> bool {
    roots.iter().any(|r| p.starts_with(r) && p != r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn file_lun(path: &Path, size: Option<&str>) -> LunConfig {
        let mut spec = format!("file:{}", path.display());
        if let Some(s) = size {
            spec.push(':');
            spec.push_str(s);
        }
        LunConfig::from_spec(&spec).unwrap()
    }

    #[test]
    fn luns_only_under_the_roots_and_only_new_files() {
        let base = std::env::temp_dir().join(format!("ironsan-paths-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("luns");
        let outside = base.join("private");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let secret = outside.join("key");
        std::fs::write(&secret, "root-only").unwrap();
        let existing = root.join("old.img");
        std::fs::write(&existing, vec![0u8; 4096]).unwrap();
        let pol = PathPolicy {
            lun_roots: vec![std::fs::canonicalize(&root).unwrap()],
            secret_roots: vec![],
            existing_files: false,
        };
        // Outside the roots: refused, with or without a size, and the
        // message is the same whether the file exists or not.
        let e1 = pol
            .admit_lun(&mut file_lun(&secret, Some("4K")))
            .unwrap_err();
        let e2 = pol
            .admit_lun(&mut file_lun(&outside.join("nothing"), Some("4K")))
            .unwrap_err();
        assert_eq!(e1, e2);
        assert!(e1.contains("lun_roots"), "{e1}");
        assert_eq!(std::fs::read(&secret).unwrap(), b"root-only", "not grown");
        // Through a symlink into the root, or `..` out of it.
        symlink(&secret, root.join("link.img")).unwrap();
        assert_eq!(
            pol.admit_lun(&mut file_lun(&root.join("link.img"), Some("4K")))
                .unwrap_err(),
            e1
        );
        symlink(&outside, root.join("dirlink")).unwrap();
        assert_eq!(
            pol.admit_lun(&mut file_lun(&root.join("dirlink/new.img"), Some("4K")))
                .unwrap_err(),
            e1
        );
        assert_eq!(
            pol.admit_lun(&mut file_lun(&root.join("../private/x"), Some("4K")))
                .unwrap_err(),
            e1
        );
        // A dangling symlink is not followed to create a file elsewhere.
        symlink(outside.join("made-by-link"), root.join("dangling.img")).unwrap();
        assert!(pol
            .admit_lun(&mut file_lun(&root.join("dangling.img"), Some("4K")))
            .is_err());
        assert!(!outside.join("made-by-link").exists());
        // An existing file under the root: not without the option.
        assert_eq!(
            pol.admit_lun(&mut file_lun(&existing, Some("8K")))
                .unwrap_err(),
            e1
        );
        let lenient = PathPolicy {
            existing_files: true,
            ..pol.clone()
        };
        lenient.admit_lun(&mut file_lun(&existing, None)).unwrap();
        // A new file: created (0600), removed again unless kept.
        let new = root.join("new.img");
        let mut l = file_lun(&new, Some("1M"));
        let g = pol.admit_lun(&mut l).unwrap();
        assert!(new.exists());
        drop(g);
        assert!(
            !new.exists(),
            "removed when the LUN did not go into service"
        );
        pol.admit_lun(&mut l).unwrap().keep();
        assert!(new.exists());
        assert!(pol
            .admit_lun(&mut file_lun(&root.join("nosize.img"), None))
            .is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn secret_files_only_under_the_roots() {
        let base = std::env::temp_dir().join(format!("ironsan-secrets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let root = base.join("secrets");
        std::fs::create_dir_all(&root).unwrap();
        let ok = root.join("s");
        std::fs::write(&ok, "a-secret-of-some-length").unwrap();
        let other = base.join("other");
        std::fs::write(&other, "x").unwrap();
        symlink(&other, root.join("link")).unwrap();
        let pol = PathPolicy {
            lun_roots: vec![],
            secret_roots: vec![std::fs::canonicalize(&root).unwrap()],
            existing_files: false,
        };
        assert!(pol.secret_path(&ok).is_ok());
        let e = pol.secret_path(&other).unwrap_err();
        assert_eq!(pol.secret_path(&root.join("link")).unwrap_err(), e);
        assert_eq!(pol.secret_path(&base.join("missing")).unwrap_err(), e);
        assert_eq!(pol.secret_path(Path::new("/etc/shadow")).unwrap_err(), e);
        assert_eq!(pol.secret_refusal(), e);
        std::fs::remove_dir_all(&base).unwrap();
    }
}
