//! Which backend serves linux-glue: the kernel module (nprdma.ko, through
//! [`ModuleClient`]) when its device node is usable, the user-space [`Glue`] otherwise.
//!
//! "Usable" means the device opens *and* the ABI version handshake succeeds: a node left behind
//! by another module version, or one this user may not open, is not usable. The setting
//! [`BACKEND_ENV`] (`NPRDMA_BACKEND=auto|kernel|user`, default `auto`) forces one side:
//! `kernel` where the module is not usable is the typed error
//! [`GlueError::KernelBackendUnavailable`] (with the reason); `auto` falls back to user space
//! and its [`Selection`] says why. `nprdma doctor` prints the selection.
//!
//! The choice runs over a seam, [`KernelProbe`] ("open the node and handshake"), so it is tested
//! without a module; [`DeviceProbe`] is the real one.

use std::fmt;
use std::sync::mpsc::Receiver;

use crate::abi;
use crate::glue::{Glue, GlueConfig};
use crate::kmod::{ModuleBackend, ModuleClient, RealModule};
use crate::registry::Invalidate;
use crate::{GlueError, Result};

/// The environment variable that chooses the backend: `auto` (default), `kernel` or `user`.
pub const BACKEND_ENV: &str = "NPRDMA_BACKEND";

/// What the setting asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BackendSetting {
    /// The kernel backend when its device is usable, else user space.
    #[default]
    Auto,
    /// The kernel backend or an error.
    Kernel,
    /// The user-space backend, without looking for the module.
    User,
}

impl BackendSetting {
    /// Parses a setting (`auto`, `kernel`, `user`; case and surrounding blanks ignored; empty
    /// means `auto`). Anything else is [`GlueError::BadSetting`].
    pub fn parse(value: &str) -> Result<Self> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" => Ok(Self::Auto),
            "kernel" => Ok(Self::Kernel),
            "user" => Ok(Self::User),
            _ => Err(GlueError::BadSetting {
                name: BACKEND_ENV,
                value: value.to_string(),
                expected: "auto, kernel or user",
            }),
        }
    }

    /// Reads [`BACKEND_ENV`]: unset is `auto`; a value that is not UTF-8 is
    /// [`GlueError::BadSetting`].
    pub fn from_env() -> Result<Self> {
        match std::env::var(BACKEND_ENV) {
            Ok(v) => Self::parse(&v),
            Err(std::env::VarError::NotPresent) => Ok(Self::Auto),
            Err(std::env::VarError::NotUnicode(v)) => Err(GlueError::BadSetting {
                name: BACKEND_ENV,
                value: v.to_string_lossy().into_owned(),
                expected: "auto, kernel or user",
            }),
        }
    }

    /// The setting's spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Kernel => "kernel",
            Self::User => "user",
        }
    }
}

/// The two backends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// nprdma.ko through its device node.
    Kernel,
    /// [`Glue`]: userfaultfd, pagemap and the reclaim scan.
    User,
}

impl BackendKind {
    /// `"kernel"` or `"user"`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::User => "user",
        }
    }
}

/// "Open the module's device and do the version handshake": the seam the choice runs over.
pub trait KernelProbe {
    /// What a successful probe yields (a connected client).
    type Client;
    /// The device node probed, for messages.
    fn path(&self) -> &str;
    /// Opens the node and shakes hands: the client, or why the kernel backend is not usable.
    fn connect(&self) -> Result<Self::Client>;
    /// The module's ABI version and feature bits as the client reports them.
    fn describe(client: &Self::Client) -> (u32, u32);
}

/// The real probe: [`RealModule::open_at`] plus [`ModuleClient::connect`].
#[derive(Clone, Debug)]
pub struct DeviceProbe {
    path: String,
}

impl Default for DeviceProbe {
    fn default() -> Self {
        Self::at(abi::DEVICE_NODE)
    }
}

impl DeviceProbe {
    /// Probes the device node at `path` instead of [`abi::DEVICE_NODE`].
    pub fn at(path: &str) -> Self {
        Self {
            path: path.to_string(),
        }
    }
}

impl KernelProbe for DeviceProbe {
    type Client = ModuleClient<RealModule>;
    fn path(&self) -> &str {
        &self.path
    }
    fn connect(&self) -> Result<Self::Client> {
        ModuleClient::connect(RealModule::open_at(&self.path)?)
    }
    fn describe(client: &Self::Client) -> (u32, u32) {
        describe_client(client)
    }
}

/// The module version and feature bits of a connected client.
pub fn describe_client<B: ModuleBackend>(client: &ModuleClient<B>) -> (u32, u32) {
    (abi::ABI_VERSION, client.features())
}

/// Why a backend was chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reason {
    /// `auto`: the device opened and the handshake succeeded.
    DeviceUsable {
        /// The device node.
        path: String,
        /// The ABI version both sides speak.
        abi_version: u32,
        /// The module's feature bits.
        features: u32,
    },
    /// `kernel` was forced and the device is usable.
    ForcedKernel {
        /// The device node.
        path: String,
        /// The ABI version both sides speak.
        abi_version: u32,
        /// The module's feature bits.
        features: u32,
    },
    /// `user` was forced; the module was not looked for.
    ForcedUser,
    /// `auto` fell back to user space: the kernel backend is not usable.
    Fallback {
        /// The device node.
        path: String,
        /// What opening or the handshake answered.
        why: GlueError,
    },
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DeviceUsable {
                path,
                abi_version,
                features,
            } => write!(
                f,
                "{BACKEND_ENV}=auto and {path} is usable (opened, ABI {abi_version} handshake \
                 succeeded, features {features:#x})"
            ),
            Self::ForcedKernel {
                path,
                abi_version,
                features,
            } => write!(
                f,
                "{BACKEND_ENV}=kernel; {path} is usable (ABI {abi_version}, features \
                 {features:#x})"
            ),
            Self::ForcedUser => write!(f, "{BACKEND_ENV}=user; the module was not looked for"),
            Self::Fallback { path, why } => write!(
                f,
                "{BACKEND_ENV}=auto and {path} is not usable ({why}); using user space"
            ),
        }
    }
}

/// The outcome of the choice: which backend, why, and the connected client for the kernel.
#[derive(Debug)]
pub struct Selection<C> {
    /// The backend chosen.
    pub kind: BackendKind,
    /// Why.
    pub reason: Reason,
    /// The connected client when `kind` is [`BackendKind::Kernel`].
    pub client: Option<C>,
}

/// Chooses the backend for `setting`, probing the kernel side with `probe` unless `user` is
/// forced. `kernel` where the probe fails is [`GlueError::KernelBackendUnavailable`].
pub fn choose<P: KernelProbe>(setting: BackendSetting, probe: &P) -> Result<Selection<P::Client>> {
    let path = probe.path().to_string();
    match setting {
        BackendSetting::User => Ok(Selection {
            kind: BackendKind::User,
            reason: Reason::ForcedUser,
            client: None,
        }),
        BackendSetting::Kernel => match probe.connect() {
            Ok(client) => {
                let (abi_version, features) = P::describe(&client);
                Ok(Selection {
                    kind: BackendKind::Kernel,
                    reason: Reason::ForcedKernel {
                        path,
                        abi_version,
                        features,
                    },
                    client: Some(client),
                })
            }
            Err(why) => Err(GlueError::KernelBackendUnavailable {
                path,
                why: Box::new(why),
            }),
        },
        BackendSetting::Auto => match probe.connect() {
            Ok(client) => {
                let (abi_version, features) = P::describe(&client);
                Ok(Selection {
                    kind: BackendKind::Kernel,
                    reason: Reason::DeviceUsable {
                        path,
                        abi_version,
                        features,
                    },
                    client: Some(client),
                })
            }
            Err(why) => Ok(Selection {
                kind: BackendKind::User,
                reason: Reason::Fallback { path, why },
                client: None,
            }),
        },
    }
}

/// An open backend: the module's client, or a [`Glue`] with its invalidation channel.
#[derive(Debug)]
pub enum Backend {
    /// nprdma.ko.
    Kernel(ModuleClient<RealModule>),
    /// The user-space backend.
    User {
        /// The glue.
        glue: Glue,
        /// Its invalidations.
        invalidations: Receiver<Invalidate>,
    },
}

impl Backend {
    /// Opens the backend [`BACKEND_ENV`] asks for (default `auto`) on the real device node;
    /// `config` configures the user-space backend. Returns the backend and why it was chosen.
    pub fn open(config: GlueConfig) -> Result<(Self, Reason)> {
        Self::open_with(BackendSetting::from_env()?, &DeviceProbe::default(), config)
    }

    /// As [`Backend::open`] with an explicit setting and probe.
    pub fn open_with(
        setting: BackendSetting,
        probe: &DeviceProbe,
        config: GlueConfig,
    ) -> Result<(Self, Reason)> {
        let sel = choose(setting, probe)?;
        match (sel.kind, sel.client) {
            (BackendKind::Kernel, Some(client)) => Ok((Self::Kernel(client), sel.reason)),
            _ => {
                let (glue, invalidations) = Glue::new(config)?;
                Ok((
                    Self::User {
                        glue,
                        invalidations,
                    },
                    sel.reason,
                ))
            }
        }
    }

    /// Which backend this is.
    pub fn kind(&self) -> BackendKind {
        match self {
            Self::Kernel(_) => BackendKind::Kernel,
            Self::User { .. } => BackendKind::User,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kmod::FakeModule;
    use std::cell::Cell;

    /// A probe whose answer is given: a handshake through the in-process fake module, or an
    /// error as opening or the handshake would return it. Counts its calls.
    struct Scripted {
        answer: Option<GlueError>,
        calls: Cell<u32>,
    }

    impl Scripted {
        fn ok() -> Self {
            Self {
                answer: None,
                calls: Cell::new(0),
            }
        }
        fn failing(e: GlueError) -> Self {
            Self {
                answer: Some(e),
                calls: Cell::new(0),
            }
        }
    }

    impl KernelProbe for Scripted {
        type Client = ModuleClient<FakeModule>;
        fn path(&self) -> &str {
            "/dev/test-node"
        }
        fn connect(&self) -> Result<Self::Client> {
            self.calls.set(self.calls.get() + 1);
            match &self.answer {
                Some(e) => Err(e.clone()),
                None => ModuleClient::connect(FakeModule::new()),
            }
        }
        fn describe(client: &Self::Client) -> (u32, u32) {
            describe_client(client)
        }
    }

    fn absent() -> GlueError {
        GlueError::ModuleNotLoaded {
            path: "/dev/test-node".into(),
        }
    }

    #[test]
    fn settings_parse_and_bad_values_are_typed_errors() {
        assert_eq!(BackendSetting::parse("auto"), Ok(BackendSetting::Auto));
        assert_eq!(BackendSetting::parse(""), Ok(BackendSetting::Auto));
        assert_eq!(
            BackendSetting::parse(" Kernel\n"),
            Ok(BackendSetting::Kernel)
        );
        assert_eq!(BackendSetting::parse("USER"), Ok(BackendSetting::User));
        let e = BackendSetting::parse("kernal").unwrap_err();
        assert!(
            matches!(&e, GlueError::BadSetting { name, value, .. }
                if *name == BACKEND_ENV && value == "kernal"),
            "{e:?}"
        );
    }

    #[test]
    fn auto_takes_the_kernel_when_the_handshake_succeeds() {
        let p = Scripted::ok();
        let s = choose(BackendSetting::Auto, &p).unwrap();
        assert_eq!(s.kind, BackendKind::Kernel);
        assert!(s.client.is_some());
        assert!(
            matches!(&s.reason, Reason::DeviceUsable { abi_version, .. }
                if *abi_version == abi::ABI_VERSION),
            "{:?}",
            s.reason
        );
        assert!(s.reason.to_string().contains("handshake succeeded"));
    }

    #[test]
    fn auto_falls_back_and_says_why_when_the_device_is_absent() {
        let p = Scripted::failing(absent());
        let s = choose(BackendSetting::Auto, &p).unwrap();
        assert_eq!(s.kind, BackendKind::User);
        assert!(s.client.is_none());
        assert_eq!(
            s.reason,
            Reason::Fallback {
                path: "/dev/test-node".into(),
                why: absent()
            }
        );
        assert!(s.reason.to_string().contains("not loaded"), "{}", s.reason);
    }

    #[test]
    fn auto_falls_back_when_the_handshake_fails() {
        let why = GlueError::AbiVersion {
            ours: abi::ABI_VERSION,
            theirs: abi::ABI_VERSION + 1,
        };
        let s = choose(BackendSetting::Auto, &Scripted::failing(why.clone())).unwrap();
        assert_eq!(s.kind, BackendKind::User);
        assert!(matches!(s.reason, Reason::Fallback { why: w, .. } if w == why));
        let denied = GlueError::PermissionDenied { what: "opening" };
        let s = choose(BackendSetting::Auto, &Scripted::failing(denied)).unwrap();
        assert_eq!(s.kind, BackendKind::User);
    }

    #[test]
    fn forcing_the_kernel_where_it_is_unusable_is_a_typed_error() {
        let e = choose(BackendSetting::Kernel, &Scripted::failing(absent())).unwrap_err();
        assert_eq!(
            e,
            GlueError::KernelBackendUnavailable {
                path: "/dev/test-node".into(),
                why: Box::new(absent())
            }
        );
        let s = choose(BackendSetting::Kernel, &Scripted::ok()).unwrap();
        assert_eq!(s.kind, BackendKind::Kernel);
        assert!(matches!(s.reason, Reason::ForcedKernel { .. }));
    }

    #[test]
    fn forcing_user_does_not_probe() {
        let p = Scripted::ok();
        let s = choose(BackendSetting::User, &p).unwrap();
        assert_eq!(s.kind, BackendKind::User);
        assert_eq!(s.reason, Reason::ForcedUser);
        assert_eq!(p.calls.get(), 0);
    }

    #[test]
    fn the_real_probe_of_a_missing_node_falls_back() {
        let p = DeviceProbe::at("/nonexistent/nprdma-glue");
        let s = choose(BackendSetting::Auto, &p).unwrap();
        assert_eq!(s.kind, BackendKind::User);
        assert!(matches!(
            s.reason,
            Reason::Fallback {
                why: GlueError::ModuleNotLoaded { .. },
                ..
            }
        ));
        assert!(matches!(
            choose(BackendSetting::Kernel, &p),
            Err(GlueError::KernelBackendUnavailable { .. })
        ));
    }
}
