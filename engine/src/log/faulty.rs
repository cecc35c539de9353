//! A test backend: real files through [`PwriteIo`], plus failure injection
//! (ENOSPC at preallocation, EIO on the Nth write or sync) and a model of
//! what a power cut would leave behind.
//!
//! The model keeps, per file (by inode), the bytes known to be on stable
//! storage (as of its last sync) and the writes since; and per directory
//! the names known durable (as of its last directory sync). A crash image
//! is that durable state written out as a fresh directory, optionally with
//! a prefix of the unsynced writes applied (the last one torn), which is
//! what a disk that persists writes in order can leave.
//!
//! Invariant: the model only ever calls a write durable after a successful
//! sync of that file, and a name durable after a successful directory sync.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use super::io::{LogIo, PwriteIo};

#[derive(Debug, Default)]
struct FileModel {
    /// Content on stable storage.
    durable: Vec<u8>,
    /// Allocated length (preallocation counts as durable: it is metadata
    /// that the directory sync after the rename makes stable).
    len: u64,
    /// Writes since the last sync, in order.
    pending: Vec<(u64, Vec<u8>)>,
}

impl FileModel {
    fn apply(&mut self, offset: u64, data: &[u8]) {
        let end = offset as usize + data.len();
        if self.durable.len() < end {
            self.durable.resize(end, 0);
        }
        self.durable[offset as usize..end].copy_from_slice(data);
    }

    fn sync(&mut self) {
        for (off, data) in std::mem::take(&mut self.pending) {
            self.apply(off, &data);
        }
    }
}

#[derive(Debug, Default)]
struct Model {
    files: HashMap<u64, FileModel>,
    /// Current directory entries.
    names: HashMap<PathBuf, u64>,
    /// Directory entries as of the last directory sync.
    durable_names: HashMap<PathBuf, u64>,
    no_space: bool,
    /// Fail the sync when this countdown reaches zero.
    syncs_until_failure: Option<u64>,
    writes_until_failure: Option<u64>,
    syncs: u64,
    /// Injected failures (EIO on a write or a sync) that have fired.
    failures_fired: u64,
    /// Those of them that hit a log segment (`*.seg`).
    segment_failures_fired: u64,
    /// Fail the next sync of a file whose name ends with this.
    fail_sync_of_name: Option<String>,
    /// Write a crash image after every mutating step.
    step_images: Option<StepImages>,
}

#[derive(Debug)]
struct StepImages {
    root: PathBuf,
    to: PathBuf,
    torn: bool,
    taken: u64,
}

impl Model {
    /// Whether `file` is currently named `*<suffix>`.
    fn named(&self, file: &File, suffix: &str) -> bool {
        ino(file).is_ok_and(|ino| {
            self.names.iter().any(|(path, i)| {
                *i == ino
                    && path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.ends_with(suffix))
            })
        })
    }

    /// Whether `file` is a segment being prepared by the log.
    fn preparing(&self, file: &File) -> bool {
        ino(file).is_ok_and(|ino| {
            self.names.iter().any(|(path, i)| {
                *i == ino
                    && path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("prealloc-") || n.starts_with("recycle-"))
            })
        })
    }

    /// Takes the next crash image, if images are being taken.
    fn step(&mut self) -> io::Result<()> {
        let Some(s) = self.step_images.as_mut() else {
            return Ok(());
        };
        s.taken += 1;
        let to = s.to.join(format!("{:06}", s.taken));
        let root = s.root.clone();
        let seed = s.torn.then_some(s.taken);
        std::fs::create_dir_all(&to)?;
        write_image(self, Some(&root), &to, seed)
    }

    fn fire(&mut self, file: &File) {
        self.failures_fired += 1;
        let on_segment = ino(file).is_ok_and(|ino| {
            self.names
                .iter()
                .any(|(path, i)| *i == ino && path.extension().is_some_and(|e| e == "seg"))
        });
        if on_segment {
            self.segment_failures_fired += 1;
        }
    }
}

fn countdown(c: &mut Option<u64>) -> bool {
    match c {
        Some(0) => {
            *c = None;
            true
        }
        Some(n) => {
            *n -= 1;
            false
        }
        None => false,
    }
}

/// Failure-injecting, crash-modelling backend for tests.
#[derive(Debug, Default)]
pub struct FaultyIo {
    inner: PwriteIo,
    model: Mutex<Model>,
}

fn ino(file: &File) -> io::Result<u64> {
    Ok(file.metadata()?.ino())
}

impl FaultyIo {
    pub fn new() -> Self {
        Self::default()
    }

    /// While set, every preallocation fails with ENOSPC.
    pub fn set_no_space(&self, on: bool) {
        self.model.lock().no_space = on;
    }

    /// The `n`th sync from now (1 = the next one) fails with EIO. Syncs
    /// of segments being prepared (`prealloc-*`, `recycle-*`) do not count:
    /// the preparer runs on its own thread at its own pace, so counting
    /// them would make the count depend on timing (see
    /// [`FaultyIo::fail_next_sync_of_file_named`] to fail those).
    pub fn fail_nth_sync(&self, n: u64) {
        assert!(n >= 1);
        self.model.lock().syncs_until_failure = Some(n - 1);
    }

    /// The `n`th data write from now (1 = the next one) fails with EIO.
    /// Writes of segments being prepared do not count (as for
    /// [`FaultyIo::fail_nth_sync`]).
    pub fn fail_nth_write(&self, n: u64) {
        assert!(n >= 1);
        self.model.lock().writes_until_failure = Some(n - 1);
    }

    /// The next sync of a file whose name ends with `suffix` (e.g.
    /// `".tmp"`, a segment being prepared) fails with EIO.
    pub fn fail_next_sync_of_file_named(&self, suffix: &str) {
        self.model.lock().fail_sync_of_name = Some(suffix.to_owned());
    }

    /// From now on, after every mutating step (create, write, sync,
    /// rename, remove, directory sync), writes what a power cut right then
    /// would leave of the files under `root` into `to/NNNNNN` (numbered
    /// from 1; see [`FaultyIo::crash_image_tree`]). With `torn`, each
    /// image also gets a torn prefix of the unsynced writes, seeded by its
    /// number.
    pub fn crash_image_at_every_step(&self, root: &Path, to: &Path, torn: bool) {
        self.model.lock().step_images = Some(StepImages {
            root: root.to_path_buf(),
            to: to.to_path_buf(),
            torn,
            taken: 0,
        });
    }

    /// Stops [`FaultyIo::crash_image_at_every_step`].
    pub fn stop_crash_images(&self) {
        self.model.lock().step_images = None;
    }

    /// Crash images taken so far by [`FaultyIo::crash_image_at_every_step`]:
    /// every image numbered at least this includes whatever was durable
    /// now.
    pub fn crash_images_taken(&self) -> u64 {
        self.model
            .lock()
            .step_images
            .as_ref()
            .map_or(0, |s| s.taken)
    }

    /// Successful data syncs so far.
    pub fn syncs(&self) -> u64 {
        self.model.lock().syncs
    }

    /// Injected write or sync failures that have fired so far, on any file
    /// (log segments, checkpoints, snapshot files).
    pub fn failures_fired(&self) -> u64 {
        self.model.lock().failures_fired
    }

    /// Injected failures that hit a log segment: from the first one on, the
    /// layer above must acknowledge nothing more. (A failed checkpoint or
    /// snapshot file loses nothing: the log still holds what it covers.)
    pub fn segment_failures_fired(&self) -> u64 {
        self.model.lock().segment_failures_fired
    }

    /// Writes what a power cut right now would leave of the files this
    /// backend has touched into `to` (an existing, empty directory).
    /// With `torn_seed`, each file also gets a pseudo-random prefix of its
    /// unsynced writes, the last of them cut at a pseudo-random byte.
    pub fn crash_image(&self, to: &Path, torn_seed: Option<u64>) -> io::Result<()> {
        self.write_image(None, to, torn_seed)
    }

    /// Like [`FaultyIo::crash_image`] for every file under `root` (several
    /// logs sharing this backend): each lands at its path relative to
    /// `root` under `to`, directories created as needed.
    pub fn crash_image_tree(
        &self,
        root: &Path,
        to: &Path,
        torn_seed: Option<u64>,
    ) -> io::Result<()> {
        self.write_image(Some(root), to, torn_seed)
    }

    fn write_image(
        &self,
        root: Option<&Path>,
        to: &Path,
        torn_seed: Option<u64>,
    ) -> io::Result<()> {
        write_image(&self.model.lock(), root, to, torn_seed)
    }
}

fn write_image(
    model: &Model,
    root: Option<&Path>,
    to: &Path,
    torn_seed: Option<u64>,
) -> io::Result<()> {
    {
        let mut rng = torn_seed.map(|s| s | 1);
        let mut next = move |bound: usize| -> usize {
            // xorshift64: enough to pick cut points reproducibly.
            let Some(x) = rng.as_mut() else { return 0 };
            *x ^= *x << 13;
            *x ^= *x >> 7;
            *x ^= *x << 17;
            (*x % (bound as u64 + 1)) as usize
        };
        // By path, so a seed draws the same cut points for the same files
        // whatever order the map holds them in.
        let mut durable_names: Vec<_> = model.durable_names.iter().collect();
        durable_names.sort();
        for (path, ino) in durable_names {
            let Some(f) = model.files.get(ino) else {
                continue;
            };
            let mut content = f.durable.clone();
            content.resize(content.len().max(f.len as usize), 0);
            let mut img = FileModel {
                durable: content,
                ..Default::default()
            };
            let keep = next(f.pending.len());
            for (i, (off, data)) in f.pending.iter().enumerate().take(keep + 1) {
                if i < keep {
                    img.apply(*off, data);
                } else if torn_seed.is_some() {
                    let cut = next(data.len());
                    img.apply(*off, &data[..cut]);
                }
            }
            let target = match root {
                Some(root) => {
                    let Ok(relative) = path.strip_prefix(root) else {
                        continue;
                    };
                    to.join(relative)
                }
                None => to.join(
                    path.file_name()
                        .ok_or_else(|| io::Error::other("no file name"))?,
                ),
            };
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(target, &img.durable)?;
        }
        Ok(())
    }
}

impl LogIo for FaultyIo {
    fn name(&self) -> &'static str {
        "faulty"
    }

    fn create_preallocated(&self, path: &Path, len: u64) -> io::Result<File> {
        let mut m = self.model.lock();
        if m.no_space {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        let file = self.inner.create_preallocated(path, len)?;
        let ino = ino(&file)?;
        m.files.insert(
            ino,
            FileModel {
                len,
                ..Default::default()
            },
        );
        m.names.insert(path.to_path_buf(), ino);
        m.step()?;
        Ok(file)
    }

    fn open_existing(&self, path: &Path) -> io::Result<File> {
        let file = self.inner.open_existing(path)?;
        let ino = ino(&file)?;
        let content = std::fs::read(path)?;
        let mut m = self.model.lock();
        m.files.insert(
            ino,
            FileModel {
                len: content.len() as u64,
                durable: content,
                pending: Vec::new(),
            },
        );
        m.names.insert(path.to_path_buf(), ino);
        m.durable_names.insert(path.to_path_buf(), ino);
        Ok(file)
    }

    fn allocate(&self, file: &File, len: u64) -> io::Result<()> {
        let mut m = self.model.lock();
        if m.no_space {
            return Err(io::Error::from_raw_os_error(libc::ENOSPC));
        }
        self.inner.allocate(file, len)?;
        if let Some(f) = m.files.get_mut(&ino(file)?) {
            f.len = f.len.max(len);
        }
        Ok(())
    }

    fn write_at(&self, file: &File, offset: u64, buf: &[u8], sync: bool) -> io::Result<()> {
        let mut m = self.model.lock();
        if !m.preparing(file) && countdown(&mut m.writes_until_failure) {
            m.fire(file);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.write_at(file, offset, buf, false)?;
        let ino = ino(file)?;
        if let Some(f) = m.files.get_mut(&ino) {
            f.pending.push((offset, buf.to_vec()));
        }
        m.step()?;
        if sync {
            drop(m);
            self.sync_data(file)?;
        }
        Ok(())
    }

    fn sync_data(&self, file: &File) -> io::Result<()> {
        let mut m = self.model.lock();
        let named = match &m.fail_sync_of_name {
            Some(suffix) => m.named(file, suffix),
            None => false,
        };
        if named {
            m.fail_sync_of_name = None;
        }
        if named || (!m.preparing(file) && countdown(&mut m.syncs_until_failure)) {
            m.fire(file);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        self.inner.sync_data(file)?;
        m.syncs += 1;
        if let Some(f) = m.files.get_mut(&ino(file)?) {
            f.sync();
        }
        m.step()
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut m = self.model.lock();
        self.inner.rename(from, to)?;
        if let Some(ino) = m.names.remove(from) {
            m.names.insert(to.to_path_buf(), ino);
        }
        m.step()
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut m = self.model.lock();
        self.inner.remove(path)?;
        m.names.remove(path);
        m.step()
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut m = self.model.lock();
        self.inner.sync_dir(dir)?;
        let names: HashMap<PathBuf, u64> = m
            .names
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        m.durable_names.retain(|p, _| p.parent() != Some(dir));
        m.durable_names.extend(names);
        m.step()
    }
}
