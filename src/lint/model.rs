//! Lines of words -> the servers haproxy would build, with the settings the
//! lint rules read, pure.
//!
//! In: the files in command-line order, each as numbered lines of words.
//! Out: every `server` of every `backend` / `listen`, with where it was
//! declared, and every line haproxy refuses. Always holds: a server's
//! settings are what haproxy 2.6 / 3.0 give it, in haproxy's order:
//!
//! - a `defaults` section starts empty, or from `defaults … from NAME`;
//!   every `defaults` section (named or not) becomes the one later
//!   proxies use implicitly, `backend X from NAME` picks one by name
//!   (`cfg_parse_listen`, `src/cfgparse-listen.c`);
//! - a proxy's `default-server` starts as its defaults' `default-server`,
//!   and a `server` as its proxy's `default-server` at that line; the
//!   server's own keywords then apply left to right, a later one winning
//!   (`srv_settings_cpy`, `parse_server`, `src/server.c`);
//! - `no-agent-check` turns agent-check off, a later `agent-check` on again;
//!   `port` / `addr` also set the agent's port / address unless
//!   `agent-port` / `agent-addr` did (`srv_parse_check_port`,
//!   `srv_parse_addr`, `src/check.c`);
//! - `server-template P N|LOW-HIGH ADDR …` makes servers `P<LOW>`…`P<HIGH>`
//!   (`N` is `1-N`), all with the line's settings (`_srv_parse_tmpl_range`);
//!   at most [`MAX_TEMPLATE`] per line and [`MAX_SERVERS`] in all are made
//!   (past that, one error on the line that hit the cap, a
//!   [`LineError`] with `refused: false`, and no more servers);
//! - a keyword's arguments are skipped by haproxy's own counts (the `skip`
//!   column of the `srv_kws` tables), so `cookie weight` is a cookie, not a
//!   weight; an unknown keyword (which haproxy refuses) takes none;
//! - sections other than `defaults`, `backend` and `listen` are read only to
//!   know where they end (`peers` and `ring` also have `server` lines);
//!
//! and the lines haproxy refuses include a keyword before any section
//! ("unknown keyword 'server' out of section"), a `\` where a
//! `server` / `default-server` / `server-template` line expects a keyword
//! (a trailing `\` is no line continuation: "unknown keyword '\'"), and
//! the `.if` limits of [`cond`], after which haproxy, and the lint, stop
//! reading the configuration.

use super::cond::{self, Conditions};
use super::tokenize::{self, Context, Word};

/// Most servers one `server-template` line makes here.
pub const MAX_TEMPLATE: u64 = 10_000;

/// Most servers made across all the files: bounds the lint's memory and
/// time whatever the templates ask for.
pub const MAX_SERVERS: usize = 100_000;

/// The server-line settings the rules read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// Variables a `default-server` line before the server names that are
    /// set nowhere (haproxy reads ""): the server inherits what they do.
    pub unset: Vec<String>,
    pub agent_check: bool,
    pub weight: bool,
    pub slowstart: bool,
    pub agent_inter: bool,
    pub agent_send: Option<Word>,
    /// The agent's port as written (`agent-port`, else `port`).
    pub agent_port: Option<Vec<u8>>,
    agent_port_explicit: bool,
    /// The agent's address as written (`agent-addr`, else `addr`).
    pub agent_addr: Option<Vec<u8>>,
    agent_addr_explicit: bool,
    /// A `default-server` line came before the server (in its proxy or
    /// the defaults it inherits): haproxy 3.3 and 3.4 start a server
    /// without one at agent health 0 (`srv_settings_init` sets no
    /// `agent.health`; only `srv_settings_cpy` from a default-server does).
    pub default_server: bool,
    /// Words a few letters from an agent keyword (`agent-sned`): (the
    /// word, the keyword meant).
    pub near_misses: Vec<(String, &'static str)>,
}

/// The agent keywords a near miss is checked against.
const AGENT_KEYWORDS: [&str; 5] = [
    "agent-check",
    "agent-send",
    "agent-port",
    "agent-addr",
    "agent-inter",
];

/// The agent keyword `word` is a few letters from (an edit distance of 1
/// or 2, a swap counting 1), if it is not one.
pub fn near_agent_keyword(word: &[u8]) -> Option<&'static str> {
    let word = std::str::from_utf8(word).ok()?;
    if AGENT_KEYWORDS.contains(&word) || !(8..=14).contains(&word.len()) {
        return None;
    }
    let mut row = Vec::new();
    AGENT_KEYWORDS.into_iter().find(|k| {
        crate::state::unasked::edit_distance(word.as_bytes(), k.as_bytes(), 2, &mut row).is_some()
    })
}

/// A proxy's load-balancing algorithm, as `balance` and `hash-type` set
/// it (inherited from its defaults section).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Balance {
    /// `balance`'s first word (`roundrobin`, `static-rr`, `source`,
    /// `hdr(host)`, …); `None`: haproxy's default, roundrobin.
    pub algorithm: Option<String>,
    /// `hash-type consistent` (else map-based, the default).
    pub consistent: bool,
}

impl Balance {
    /// haproxy's algorithm lacks `BE_LB_PROP_DYN`: agent weights other
    /// than 0% and 100% are refused ("Backend is using a static LB
    /// algorithm", `server_parse_weight_change_request`) and slowstart does
    /// not ramp. Static: `static-rr`, and the hashing algorithms with the
    /// map-based hash (`lb_map.c`); dynamic: roundrobin, leastconn, first,
    /// random and consistent hashing (`lb_fwrr.c`, `lb_fwlc.c`,
    /// `lb_fas.c`, `lb_chash.c` set `BE_LB_PROP_DYN`).
    pub fn is_static(&self) -> bool {
        let Some(algorithm) = self.algorithm.as_deref() else {
            return false;
        };
        let name = algorithm.split('(').next().unwrap_or_default();
        match name {
            "static-rr" => true,
            "source" | "uri" | "url_param" | "hdr" | "rdp-cookie" | "hash" | "log-hash" => {
                !self.consistent
            }
            _ => false,
        }
    }

    /// `balance static-rr`, `balance source (hash-type map-based)`.
    pub fn describe(&self) -> String {
        let algorithm = self.algorithm.as_deref().unwrap_or("roundrobin");
        if algorithm.starts_with("static-rr") {
            return format!("balance {algorithm}");
        }
        format!("balance {algorithm} (hash-type map-based)")
    }
}

/// `load-server-state-from-file`, as a proxy has it (from its defaults
/// unless it says; haproxy's default is `none`): where a reload or restart
/// reads the state (admin state, the agent's weight) its servers start in
/// (`apply_server_state`, `src/server_state.c`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LoadState {
    #[default]
    None,
    /// `global`'s `server-state-file`.
    Global,
    /// A file of the proxy's own (`server-state-file-name`, else its name).
    Local,
}

/// A proxy's settings that hold for all its servers, wherever in the
/// section they are written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct ProxySettings {
    balance: Balance,
    load_state: LoadState,
}

/// One server as haproxy builds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    /// Index into the files given.
    pub file: usize,
    pub line: usize,
    pub backend: String,
    pub name: String,
    /// The address word (`127.0.0.1:80`, `ipv4@host:80`, …).
    pub address: Vec<u8>,
    pub settings: Settings,
    /// Its proxy's algorithm (as the whole proxy section sets it).
    pub balance: Balance,
    /// Its proxy's `load-server-state-from-file`.
    pub load_state: LoadState,
    /// Made by a `server-template` line: the name of the line's last slot.
    pub template: Option<String>,
    /// Variables its line names that are set nowhere (haproxy reads "").
    pub unset: Vec<String>,
}

/// A line haproxy refuses, or the one where the lint stopped making servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineError {
    pub file: usize,
    pub line: usize,
    pub message: String,
    /// haproxy refuses the line (else: the lint's own [`MAX_SERVERS`] cap).
    pub refused: bool,
}

/// Everything the rules need.
#[derive(Debug, Default)]
pub struct Model {
    pub servers: Vec<Server>,
    pub errors: Vec<LineError>,
    /// `global`'s `hard-stop-after`: how long a reload's old process may
    /// keep serving.
    pub hard_stop_after: Option<std::time::Duration>,
    /// `global`'s `server-state-file` and `server-state-base`, as written.
    pub server_state_file: Option<Vec<u8>>,
    pub server_state_base: Option<Vec<u8>>,
    /// A `server-state-file` or `-base` line was read (or passed over)
    /// under a condition the lint cannot evaluate: the name may not be
    /// haproxy's.
    pub server_state_guessed: bool,
}

impl Model {
    /// The file `load-server-state-from-file global` reads, as haproxy
    /// names it (`srv_state_get_filepath`, `src/server_state.c`): the
    /// `server-state-file` as written when absolute or without a
    /// `server-state-base`, else joined to the base.
    pub fn server_state_path(&self) -> Option<std::path::PathBuf> {
        use std::os::unix::ffi::OsStrExt;
        let file = self.server_state_file.as_deref()?;
        let path = |b: &[u8]| std::path::PathBuf::from(std::ffi::OsStr::from_bytes(b));
        match &self.server_state_base {
            Some(base) if !file.starts_with(b"/") => Some(path(base).join(path(file))),
            _ => Some(path(file)),
        }
    }
}

/// Every section keyword haproxy 2.6 and 3.0 register.
const SECTIONS: &[&[u8]] = &[
    b"global",
    b"defaults",
    b"frontend",
    b"backend",
    b"listen",
    b"peers",
    b"resolvers",
    b"userlist",
    b"program",
    b"http-errors",
    b"ring",
    b"mailers",
    b"cache",
    b"crt-store",
    b"log-forward",
    b"fcgi-app",
    b"namespace_list",
    b"traces",
];

/// Server keywords taking one argument (`skip` 1 in `src/server.c`,
/// `src/check.c`, `src/cfgparse-ssl.c`, `src/cfgparse-tcp.c`), plus
/// `usesrc` and `interface`, which follow `source`.
const ONE_ARG: &[&[u8]] = &[
    b"addr",
    b"agent-addr",
    b"agent-inter",
    b"agent-port",
    b"agent-send",
    b"alpn",
    b"ca-file",
    b"check-alpn",
    b"check-proto",
    b"check-sni",
    b"ciphers",
    b"ciphersuites",
    b"client-sigalgs",
    b"cookie",
    b"crl-file",
    b"crt",
    b"curves",
    b"downinter",
    b"error-limit",
    b"fall",
    b"fastinter",
    b"guid",
    b"hash-key",
    b"id",
    b"init-addr",
    b"inter",
    b"interface",
    b"log-bufsize",
    b"log-proto",
    b"max-reuse",
    b"maxconn",
    b"maxqueue",
    b"minconn",
    b"namespace",
    b"npn",
    b"observe",
    b"on-error",
    b"on-marked-down",
    b"on-marked-up",
    b"pool-conn-name",
    b"pool-low-conn",
    b"pool-max-conn",
    b"pool-purge-delay",
    b"port",
    b"proto",
    b"proxy-v2-options",
    b"redir",
    b"resolve-net",
    b"resolve-opts",
    b"resolve-prefer",
    b"resolvers",
    b"rise",
    b"shard",
    b"sigalgs",
    b"slowstart",
    b"sni",
    b"socks4",
    b"source",
    b"ssl-max-ver",
    b"ssl-min-ver",
    b"tcp-ut",
    b"track",
    b"usesrc",
    b"verify",
    b"verifyhost",
    b"weight",
    b"ws",
];

impl Settings {
    /// Applies a `server` / `default-server` line's keywords, in order;
    /// `Some(reason)` when haproxy refuses one the lint knows it refuses.
    pub fn apply(&mut self, words: &[Word]) -> Option<&'static str> {
        let mut refused = None;
        let mut i = 0;
        while let Some(word) = words.get(i) {
            let keyword = word.text.as_slice();
            let takes_arg = ONE_ARG.contains(&keyword);
            let arg = words.get(i + 1).filter(|_| takes_arg);
            if let Some(v) = arg.filter(|v| TIME_ARG.contains(&keyword) && !v.text.is_empty()) {
                if haproxy_time(&v.text).is_none() {
                    refused = refused.or(Some(BAD_TIME));
                }
            }
            match (keyword, arg) {
                (b"\\", _) => refused = refused.or(Some(BACKSLASH)),
                (b"agent-check", _) => self.agent_check = true,
                (b"no-agent-check", _) => self.agent_check = false,
                (b"weight", Some(_)) => self.weight = true,
                (b"slowstart", Some(_)) => self.slowstart = true,
                (b"agent-inter", Some(_)) => self.agent_inter = true,
                (b"agent-send", Some(v)) => self.agent_send = Some(v.clone()),
                (b"agent-port", Some(v)) => {
                    self.agent_port = Some(v.text.clone());
                    self.agent_port_explicit = true;
                }
                (b"port", Some(v)) if !self.agent_port_explicit => {
                    self.agent_port = Some(v.text.clone());
                }
                (b"agent-addr", Some(v)) => {
                    self.agent_addr = Some(v.text.clone());
                    self.agent_addr_explicit = true;
                }
                (b"addr", Some(v)) if !self.agent_addr_explicit => {
                    self.agent_addr = Some(v.text.clone());
                }
                _ => {
                    if let Some(meant) = near_agent_keyword(keyword) {
                        let word = String::from_utf8_lossy(keyword).into_owned();
                        self.near_misses.push((word, meant));
                    }
                }
            }
            i += 1 + usize::from(takes_arg);
        }
        refused
    }
}

/// Server keywords whose argument is a time (`parse_time_err`: haproxy
/// refuses any other character, "unexpected character 'a' in 'agent-inter'
/// argument"); an empty one (a variable set nowhere) is named elsewhere.
const TIME_ARG: &[&[u8]] = &[
    b"agent-inter",
    b"inter",
    b"fastinter",
    b"downinter",
    b"slowstart",
];

const BAD_TIME: &str = "a time haproxy cannot read (digits, then us, ms, s, m, h or d; ${VAR} only inside double quotes): haproxy refuses the line";

const BACKSLASH: &str =
    "unknown keyword '\\' (haproxy has no line continuation: a trailing \\ is a word)";

/// Where the lines being read go.
enum Section {
    /// Before the file's first section: haproxy refuses any keyword.
    None,
    /// In a section the lint does not read.
    Other,
    /// `global`.
    Global,
    /// `defaults`: index into `Builder::defaults`.
    Defaults(usize),
    /// `backend` / `listen`: its name and its `default-server`.
    Proxy {
        name: String,
        default_server: Settings,
    },
}

#[derive(Default)]
struct Builder {
    /// Every `defaults` section so far: its name, `default-server` and
    /// proxy settings.
    defaults: Vec<(Vec<u8>, Settings, ProxySettings)>,
    /// Each proxy's settings, set after the servers are made (a `balance`
    /// line may follow them).
    proxies: std::collections::HashMap<String, ProxySettings>,
    /// The last `defaults` section, which proxies use unless `from` says.
    last_defaults: Option<usize>,
    /// haproxy stops reading the configuration (an aborting `.if`).
    aborted: bool,
    /// [`MAX_SERVERS`] was reached: no more servers are made.
    full: bool,
    /// `global`'s `setenv`, `presetenv`, `unsetenv` and `resetenv` so far.
    vars: Vars,
    model: Model,
}

/// The environment as `global`'s `setenv`, `presetenv`, `unsetenv` and
/// `resetenv` leave it for the lines after them (haproxy applies each as
/// it reads it, `cfg_parse_global` in `src/cfgparse-global.c`), over the
/// environment the lint was given.
#[derive(Default)]
struct Vars {
    /// Set (`Some`) or unset (`None`) by a line.
    set: std::collections::HashMap<String, Option<String>>,
    /// After `resetenv`: the only names of the given environment kept.
    kept: Option<std::collections::HashSet<String>>,
}

impl Vars {
    fn get(&self, name: &str, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        if let Some(v) = self.set.get(name) {
            return v.clone();
        }
        match &self.kept {
            Some(kept) if !kept.contains(name) => None,
            _ => env(name),
        }
    }

    /// A `global` line: applied when it is one of the four.
    fn apply(&mut self, words: &[Word], env: &dyn Fn(&str) -> Option<String>) {
        let text = |i: usize| {
            words
                .get(i)
                .map(|w| String::from_utf8_lossy(&w.text).into_owned())
        };
        let names = || (1..words.len()).filter_map(text);
        match words[0].text.as_slice() {
            b"setenv" | b"presetenv" if words.len() == 3 => {
                let (Some(name), Some(value)) = (text(1), text(2)) else {
                    return;
                };
                let keep = words[0].text == b"presetenv" && self.get(&name, env).is_some();
                if !keep {
                    self.set.insert(name, Some(value));
                }
            }
            b"unsetenv" => {
                for name in names() {
                    self.set.insert(name, None);
                }
            }
            b"resetenv" => {
                let names: std::collections::HashSet<String> = names().collect();
                self.set.retain(|name, _| names.contains(name));
                self.kept = Some(match self.kept.take() {
                    Some(kept) => kept.intersection(&names).cloned().collect(),
                    None => names,
                });
            }
            _ => {}
        }
    }
}

/// Reads the files (name, bytes), in the order haproxy would (`-f` order).
pub fn build(files: &[(String, Vec<u8>)], env: &dyn Fn(&str) -> Option<String>) -> Model {
    let mut b = Builder::default();
    for (index, (name, text)) in files.iter().enumerate() {
        if b.aborted {
            break;
        }
        b.file(index, name, text, env);
    }
    for server in &mut b.model.servers {
        if let Some(proxy) = b.proxies.get(&server.backend) {
            server.balance = proxy.balance.clone();
            server.load_state = proxy.load_state;
        }
    }
    b.model
}

impl Builder {
    fn file(
        &mut self,
        file: usize,
        name: &str,
        text: &[u8],
        given: &dyn Fn(&str) -> Option<String>,
    ) {
        let mut section = Section::None;
        let mut label = String::new();
        let mut conditions = Conditions::default();
        for (line, bytes) in tokenize::physical_lines(text) {
            let vars = &self.vars;
            let env = &|name: &str| vars.get(name, given);
            let ctx = Context {
                env,
                file: name,
                section: &label,
                unset: Default::default(),
            };
            let words = match tokenize::parse_line(bytes, line, &ctx) {
                Ok(words) => words,
                Err(e) => {
                    self.error(file, line, e.to_string());
                    if e == tokenize::LineError::StrayNul {
                        break;
                    }
                    continue;
                }
            };
            let texts: Vec<&[u8]> = words.iter().map(|w| w.text.as_slice()).collect();
            match conditions.line(&texts, env) {
                cond::Line::Directive(Some(reason)) => self.error(file, line, reason.to_owned()),
                cond::Line::Abort(reason) => {
                    self.error(file, line, reason.to_owned());
                    self.aborted = true;
                    break;
                }
                cond::Line::Config { active: true } if !words.is_empty() => {
                    if SECTIONS.contains(&texts[0]) {
                        label = String::from_utf8_lossy(texts.get(1).unwrap_or(&texts[0])).into();
                        section = self.section(file, line, &texts);
                    } else {
                        let unset = ctx.unset.into_inner();
                        self.keyword((file, line, unset), &mut section, &words, given);
                    }
                }
                _ => {}
            }
            if matches!(
                texts.first(),
                Some(&(b"server-state-file" | b"server-state-base"))
            ) {
                self.model.server_state_guessed |= conditions.guessed();
            }
        }
    }

    fn error(&mut self, file: usize, line: usize, message: String) {
        self.model.errors.push(LineError {
            file,
            line,
            message,
            refused: true,
        });
    }

    /// A section header line: the section the next lines go to.
    fn section(&mut self, file: usize, line: usize, words: &[&[u8]]) -> Section {
        let keyword = words[0];
        let (name, from) = match words {
            [b"defaults", b"from", from] => (&b""[..], Some(*from)),
            [_, name, b"from", from, ..] => (*name, Some(*from)),
            [_, name, ..] => (*name, None),
            [_] => (&b""[..], None),
            [] => return Section::Other,
        };
        let base = match from {
            Some(from) => {
                let found = self
                    .defaults
                    .iter()
                    .rposition(|(n, _, _)| n.as_slice() == from);
                if found.is_none() {
                    let from = String::from_utf8_lossy(from);
                    self.error(file, line, format!("defaults section '{from}' not found"));
                }
                found
            }
            None if keyword == b"defaults" => None,
            None => self.last_defaults,
        };
        let (settings, proxy) = base
            .map(|i| (self.defaults[i].1.clone(), self.defaults[i].2.clone()))
            .unwrap_or_default();
        match keyword {
            b"defaults" => {
                self.defaults.push((name.to_vec(), settings, proxy));
                self.last_defaults = Some(self.defaults.len() - 1);
                Section::Defaults(self.defaults.len() - 1)
            }
            b"backend" | b"listen" => {
                let name = String::from_utf8_lossy(name).into_owned();
                self.proxies.insert(name.clone(), proxy);
                Section::Proxy {
                    name,
                    default_server: settings,
                }
            }
            b"global" => Section::Global,
            _ => Section::Other,
        }
    }

    /// A keyword line inside a section (or before any), with the
    /// variables it names that are set nowhere; `given`: the environment
    /// the lint was given.
    fn keyword(
        &mut self,
        (file, line, unset): (usize, usize, Vec<String>),
        section: &mut Section,
        words: &[Word],
        given: &dyn Fn(&str) -> Option<String>,
    ) {
        let keyword = words[0].text.as_slice();
        let refused = match (section, keyword) {
            (Section::None, _) if !keyword.starts_with(b".") => {
                let keyword = String::from_utf8_lossy(keyword);
                self.error(
                    file,
                    line,
                    format!("unknown keyword '{keyword}' out of section"),
                );
                None
            }
            (Section::Defaults(i), b"default-server") => {
                let settings = &mut self.defaults[*i].1;
                settings.default_server = true;
                settings.unset.extend(unset);
                settings.apply(&words[1..])
            }
            (Section::Proxy { default_server, .. }, b"default-server") => {
                default_server.default_server = true;
                default_server.unset.extend(unset);
                default_server.apply(&words[1..])
            }
            (Section::Defaults(i), b"balance" | b"hash-type") => {
                self.defaults[*i].2.balance.set(words);
                None
            }
            (Section::Proxy { name, .. }, b"balance" | b"hash-type") => {
                self.proxies
                    .entry(name.clone())
                    .or_default()
                    .balance
                    .set(words);
                None
            }
            (Section::Defaults(i), b"load-server-state-from-file") => load_state(words)
                .map(|l| self.defaults[*i].2.load_state = l)
                .err(),
            (Section::Proxy { name, .. }, b"load-server-state-from-file") => {
                let proxy = self.proxies.entry(name.clone()).or_default();
                load_state(words).map(|l| proxy.load_state = l).err()
            }
            // The first one counts: haproxy alerts "already specified" on
            // a second one and keeps the first (`cfg_parse_global`).
            (Section::Global, b"server-state-file") => {
                let model = &mut self.model;
                if model.server_state_file.is_none() {
                    model.server_state_file = words.get(1).map(|w| w.text.clone());
                }
                None
            }
            (Section::Global, b"server-state-base") => {
                let model = &mut self.model;
                if model.server_state_base.is_none() {
                    model.server_state_base = words.get(1).map(|w| w.text.clone());
                }
                None
            }
            (Section::Global, b"setenv" | b"presetenv" | b"unsetenv" | b"resetenv") => {
                self.vars.apply(words, given);
                None
            }
            (Section::Global, b"hard-stop-after") => {
                // 0 is haproxy's "never" (TICK_ETERNITY), as when unset.
                self.model.hard_stop_after = words
                    .get(1)
                    .and_then(|w| haproxy_time(&w.text))
                    .filter(|d| !d.is_zero());
                None
            }
            (
                Section::Proxy {
                    name,
                    default_server,
                },
                b"server",
            ) if words.len() >= 3 => {
                let mut settings = default_server.clone();
                let refused = settings.apply(&words[3..]);
                let name = (name.clone(), words[1].text.clone());
                let at = (file, line, [settings.unset.clone(), unset].concat());
                self.servers(at, name, &words[2].text, settings, None);
                refused
            }
            (
                Section::Proxy {
                    name,
                    default_server,
                },
                b"server-template",
            ) if words.len() >= 4 => {
                let Some((low, high)) = template_range(&words[2].text) else {
                    let range = String::from_utf8_lossy(&words[2].text);
                    self.error(file, line, format!("wrong server-template range '{range}'"));
                    return;
                };
                let mut settings = default_server.clone();
                let refused = settings.apply(&words[4..]);
                let high = high.min(low.saturating_add(MAX_TEMPLATE - 1));
                let name = (name.clone(), words[1].text.clone());
                let at = (file, line, [settings.unset.clone(), unset].concat());
                self.servers(at, name, &words[3].text, settings, Some(low..=high));
                refused
            }
            _ => None,
        };
        if let Some(reason) = refused {
            self.error(file, line, reason.to_owned());
        }
    }

    /// Makes the servers of one line: `backend/prefix<n>` for each n of a
    /// template's `numbers`, or `backend/prefix` alone for a `server` line
    /// (`None`); stops at [`MAX_SERVERS`] in all.
    fn servers(
        &mut self,
        (file, line, unset): (usize, usize, Vec<String>),
        (backend, prefix): (String, Vec<u8>),
        address: &[u8],
        settings: Settings,
        numbers: Option<std::ops::RangeInclusive<u64>>,
    ) {
        if self.full {
            return;
        }
        let template = numbers.is_some();
        let numbers = numbers.unwrap_or(0..=0);
        let wanted = numbers.end() - numbers.start() + 1;
        let room = MAX_SERVERS - self.model.servers.len();
        let prefix = String::from_utf8_lossy(&prefix);
        let last = template.then(|| {
            format!(
                "{prefix}{}",
                numbers.end().min(
                    &numbers
                        .start()
                        .saturating_add(room as u64)
                        .saturating_sub(1)
                )
            )
        });
        let servers = numbers.take(room).map(|n| Server {
            file,
            line,
            backend: backend.clone(),
            name: if template {
                format!("{prefix}{n}")
            } else {
                prefix.to_string()
            },
            address: address.to_vec(),
            settings: settings.clone(),
            balance: Balance::default(),
            load_state: LoadState::None,
            template: last.clone(),
            unset: unset.clone(),
        });
        self.model.servers.extend(servers);
        if wanted > room as u64 {
            self.full = true;
            self.model.errors.push(LineError {
                file,
                line,
                message: format!("more than {MAX_SERVERS} servers in all: the lint checks the first {MAX_SERVERS} and makes none past them"),
                refused: false,
            });
        }
    }
}

/// A `load-server-state-from-file` line's mode (`cfg_parse_listen`,
/// `src/cfgparse-listen.c`, refuses any other word).
fn load_state(words: &[Word]) -> Result<LoadState, &'static str> {
    match words.get(1).map(|w| w.text.as_slice()) {
        Some(b"global") => Ok(LoadState::Global),
        Some(b"local") => Ok(LoadState::Local),
        Some(b"none") => Ok(LoadState::None),
        _ => Err("'load-server-state-from-file' expects 'global', 'local' or 'none'"),
    }
}

impl Balance {
    /// A `balance` or `hash-type` line.
    fn set(&mut self, words: &[Word]) {
        let word = |i: usize| {
            words
                .get(i)
                .map(|w| String::from_utf8_lossy(&w.text).into_owned())
        };
        match words[0].text.as_slice() {
            b"balance" => self.algorithm = word(1),
            _ => self.consistent = word(1).as_deref() == Some("consistent"),
        }
    }
}

/// A haproxy time (`parse_time_err`): digits, then a unit (`us`, `ms`,
/// `s`, `m`, `h`, `d`; none is milliseconds).
pub fn haproxy_time(text: &[u8]) -> Option<std::time::Duration> {
    let digits = text.iter().take_while(|b| b.is_ascii_digit()).count();
    let n: u64 = std::str::from_utf8(&text[..digits]).ok()?.parse().ok()?;
    let ms = match &text[digits..] {
        b"us" => return Some(std::time::Duration::from_micros(n)),
        b"" | b"ms" => 1,
        b"s" => 1_000,
        b"m" => 60_000,
        b"h" => 3_600_000,
        b"d" => 86_400_000,
        _ => return None,
    };
    Some(std::time::Duration::from_millis(n.saturating_mul(ms)))
}

/// C `atol`: optional blanks and sign, then digits; 0 when there are none.
/// Saturates instead of overflowing.
pub fn atol(s: &[u8]) -> i64 {
    let s = s.trim_ascii_start();
    let (negative, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, s),
    };
    let magnitude = digits
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0i64, |n, &d| {
            n.saturating_mul(10).saturating_add(i64::from(d - b'0'))
        });
    if negative {
        -magnitude
    } else {
        magnitude
    }
}

/// `_srv_parse_tmpl_range`: `N` is `1..=N`, `LOW-HIGH` is `LOW..=HIGH`
/// (each read with `atoi`); `None` when haproxy refuses it (low < 0 or
/// high < low, so also `0`).
fn template_range(arg: &[u8]) -> Option<(u64, u64)> {
    let first = atol(arg);
    let (low, high) = match arg.iter().position(|&b| b == b'-') {
        Some(dash) => (first, atol(&arg[dash + 1..])),
        None => (1, first),
    };
    if low < 0 || high < low {
        return None;
    }
    Some((low.unsigned_abs(), high.unsigned_abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn servers(config: &str) -> Vec<Server> {
        let files = [("h.cfg".to_owned(), config.as_bytes().to_vec())];
        let model = build(&files, &|name| (name == "SET").then(|| "1".into()));
        assert_eq!(model.errors, [], "{config}");
        model.servers
    }

    #[test]
    fn hard_stop_after_is_read_from_global_in_haproxy_time_units() {
        let stop = |config: &str| {
            let files = [("h.cfg".to_owned(), config.as_bytes().to_vec())];
            build(&files, &|_| None).hard_stop_after
        };
        let secs = |n| Some(std::time::Duration::from_secs(n));
        assert_eq!(stop("global\n hard-stop-after 30s\n"), secs(30));
        assert_eq!(stop("global\n hard-stop-after 2h\n"), secs(7200));
        assert_eq!(stop("global\n hard-stop-after 1d\n"), secs(86400));
        assert_eq!(
            stop("global\n hard-stop-after 1500\n"),
            Some(std::time::Duration::from_millis(1500))
        );
        // 0 is "never" (TICK_ETERNITY), as when it is not set.
        assert_eq!(stop("global\n hard-stop-after 0\n"), None);
        assert_eq!(stop("global\n maxconn 10\n"), None);
        assert_eq!(
            stop("defaults\n hard-stop-after 30s\n"),
            None,
            "a global keyword"
        );
    }

    fn names(config: &str) -> Vec<String> {
        servers(config)
            .iter()
            .map(|s| format!("{}/{}", s.backend, s.name))
            .collect()
    }

    /// (name, weight set, agent-check on) of each server.
    fn weights(config: &str) -> Vec<(String, bool, bool)> {
        let s = servers(config);
        s.into_iter()
            .map(|s| (s.name, s.settings.weight, s.settings.agent_check))
            .collect()
    }

    #[test]
    fn servers_come_from_backend_and_listen_only() {
        let config = "peers p\n server s1 127.0.0.1:1\nring r\n server s2 127.0.0.1:2\n\
                      frontend f\n bind :80\nbackend be\n server s3 127.0.0.1:3\n\
                      listen li\n server s4 127.0.0.1:4\n";
        assert_eq!(names(config), ["be/s3", "li/s4"]);
        let s = &servers(config)[0];
        assert_eq!(
            (s.file, s.line, s.address.as_slice()),
            (0, 8, &b"127.0.0.1:3"[..])
        );
    }

    #[test]
    fn weight_from_the_defaults_default_server() {
        let config =
            "defaults\n default-server weight 100\nbackend be\n server s1 a:1 agent-check\n";
        assert_eq!(weights(config), [("s1".into(), true, true)]);
    }

    #[test]
    fn weight_from_the_proxy_default_server_applies_to_later_servers_only() {
        let config = "backend be\n server s0 a:1\n default-server weight 100\n server s1 a:1\n";
        assert_eq!(
            weights(config),
            [("s0".into(), false, false), ("s1".into(), true, false)]
        );
    }

    #[test]
    fn a_new_anonymous_defaults_resets_and_the_last_defaults_applies() {
        let config = "defaults\n default-server weight 100\ndefaults\nbackend be\n server s1 a:1\n\
                      defaults named\n default-server weight 5\nbackend b2\n server s2 a:1\n";
        assert_eq!(
            weights(config),
            [("s1".into(), false, false), ("s2".into(), true, false)]
        );
    }

    #[test]
    fn named_defaults_by_from() {
        let config = "defaults withweight\n default-server weight 100 agent-check\n\
                      defaults\nbackend be from withweight\n server s1 a:1\n\
                      defaults child from withweight\nbackend b2 from child\n server s2 a:1\n\
                      defaults from withweight\nbackend b3\n server s3 a:1\n";
        let want = [("s1", true, true), ("s2", true, true), ("s3", true, true)];
        let want: Vec<_> = want.iter().map(|(n, w, a)| ((*n).into(), *w, *a)).collect();
        assert_eq!(weights(config), want);
    }

    #[test]
    fn unknown_from_is_an_error() {
        let files = [("h.cfg".to_owned(), b"backend be from nope\n".to_vec())];
        let errors = build(&files, &|_| None).errors;
        assert_eq!(errors[0].message, "defaults section 'nope' not found");
    }

    #[test]
    fn later_keywords_override_and_no_agent_check_turns_it_off() {
        let config = "backend be\n default-server agent-check\n server s1 a:1\n\
                      server s2 a:1 no-agent-check\n server s3 a:1 no-agent-check agent-check\n";
        let on: Vec<bool> = servers(config)
            .iter()
            .map(|s| s.settings.agent_check)
            .collect();
        assert_eq!(on, [true, false, true]);
    }

    #[test]
    fn keyword_arguments_are_skipped_by_haproxy_counts() {
        let config = "backend be\n server s1 a:1 cookie weight agent-send x\n";
        let s = &servers(config)[0].settings;
        assert!(!s.weight, "the cookie is named weight");
        assert_eq!(
            s.agent_send.as_ref().map(|w| w.text.clone()),
            Some(b"x".to_vec())
        );
    }

    #[test]
    fn port_and_addr_stand_in_for_the_agent_ones_unless_set() {
        let config = "backend be\n server s1 a:1 port 80 addr 10.0.0.1\n\
                      server s2 a:1 agent-port 9777 port 80 agent-addr 127.0.0.1 addr 10.0.0.1\n";
        let s = servers(config);
        let got: Vec<_> = s
            .iter()
            .map(|s| (s.settings.agent_port.clone(), s.settings.agent_addr.clone()))
            .collect();
        let want = [
            (Some(b"80".to_vec()), Some(b"10.0.0.1".to_vec())),
            (Some(b"9777".to_vec()), Some(b"127.0.0.1".to_vec())),
        ];
        assert_eq!(got, want);
    }

    #[test]
    fn server_template_expands_with_the_line_settings() {
        let config =
            "backend be\n server-template web 3 a:1 weight 10\n server-template x 5-6 a:1\n";
        assert_eq!(
            names(config),
            ["be/web1", "be/web2", "be/web3", "be/x5", "be/x6"]
        );
        assert!(servers(config)[2].settings.weight);
        let files = [(
            "h.cfg".to_owned(),
            b"backend be\n server-template w 0 a:1\n".to_vec(),
        )];
        assert_eq!(
            build(&files, &|_| None).errors[0].message,
            "wrong server-template range '0'"
        );
        let huge = "backend be\n server-template w 99999999999 a:1\n";
        assert_eq!(servers(huge).len() as u64, MAX_TEMPLATE);
    }

    #[test]
    fn conditional_blocks_choose_the_lines() {
        let config =
            "backend be\n.if defined(SET)\n server s1 a:1\n.else\n server s2 a:1\n.endif\n\
                      .if defined(UNSET)\n server s3 a:1\n.endif\n";
        assert_eq!(names(config), ["be/s1"]);
    }

    #[test]
    fn refused_lines_are_errors_and_a_nul_stops_the_file() {
        let files = [(
            "h.cfg".to_owned(),
            b"backend be\n server s1 'a:1\n.endif\n server s2 a\0:1\n server s3 a:1\n".to_vec(),
        )];
        let model = build(&files, &|_| None);
        let got: Vec<_> = model
            .errors
            .iter()
            .map(|e| (e.line, e.message.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (2, "unmatched quote"),
                (3, "lone '.endif'"),
                (4, "stray NUL character")
            ]
        );
        assert!(model.servers.is_empty());
    }

    #[test]
    fn each_file_starts_outside_any_section_but_defaults_carry_over() {
        let files = [
            (
                "a.cfg".to_owned(),
                b"defaults\n default-server weight 1\nbackend be\n".to_vec(),
            ),
            (
                "b.cfg".to_owned(),
                b" server s0 a:1\nbackend b2\n server s1 a:1\n".to_vec(),
            ),
        ];
        let s = build(&files, &|_| None).servers;
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].file, s[0].name.as_str(), s[0].settings.weight),
            (1, "s1", true)
        );
    }

    /// (line, message, refused) of each error of `files`.
    fn errors(files: &[(&str, &str)]) -> Vec<(usize, String, bool)> {
        let files: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(n, t)| (n.to_string(), t.as_bytes().to_vec()))
            .collect();
        let model = build(&files, &|_| None);
        model
            .errors
            .into_iter()
            .map(|e| (e.line, e.message, e.refused))
            .collect()
    }

    #[test]
    fn a_keyword_before_any_section_is_refused() {
        let got = errors(&[("h.cfg", "# c\n server s0 a:1\n.notice hi\nbackend be\n")]);
        let want = (
            2,
            "unknown keyword 'server' out of section".to_owned(),
            true,
        );
        assert_eq!(got, [want]);
    }

    #[test]
    fn a_backslash_keyword_on_a_server_line_is_refused() {
        let config = "defaults\n default-server weight 1 \\\nbackend be\n server s1 a:1 check \\\n  agent-check\n server s2 a:1 cookie \\\n";
        let got = errors(&[("h.cfg", config)]);
        let line = |n| (n, BACKSLASH.to_owned(), true);
        assert_eq!(got, [line(2), line(4)], "a cookie named \\ is a cookie");
    }

    #[test]
    fn servers_stop_at_the_total_cap_with_one_error() {
        let config = "backend be\n server-template x 1-100000 a:1\n".repeat(15);
        let files = [("h.cfg".to_owned(), config.into_bytes())];
        let model = build(&files, &|_| None);
        assert_eq!(model.servers.len(), MAX_SERVERS);
        let errors: Vec<_> = model.errors.iter().map(|e| (e.line, e.refused)).collect();
        assert_eq!(errors, [(22, false)], "{:?}", model.errors);
        assert_eq!(model.servers.last().unwrap().name, "x10000");
    }

    #[test]
    fn an_aborting_if_stops_every_file() {
        let deep = format!(".if {}1{}\n", "(".repeat(50_000), ")".repeat(50_000));
        let a = format!("backend be\n server s1 a:1\n{deep} server s2 a:1\n");
        let files = [
            ("a.cfg", a.as_str()),
            ("b.cfg", "backend b\n server s3 a:1\n"),
        ];
        let got = errors(&files);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].0, got[0].2), (3, true));
        assert!(got[0]
            .1
            .starts_with("unparsable conditional sub-expression"));
        let files: Vec<(String, Vec<u8>)> = files
            .iter()
            .map(|(n, t)| (n.to_string(), t.as_bytes().to_vec()))
            .collect();
        assert_eq!(build(&files, &|_| None).servers.len(), 1);
    }

    #[test]
    fn atol_reads_like_c() {
        for (s, want) in [
            ("9777", 9777),
            (" 12x", 12),
            ("-3", -3),
            ("+4", 4),
            ("x", 0),
            ("", 0),
        ] {
            assert_eq!(atol(s.as_bytes()), want, "{s:?}");
        }
        assert_eq!(atol(b"99999999999999999999999"), i64::MAX);
    }

    #[test]
    fn the_server_state_file_is_named_as_haproxy_names_it() {
        let path = |config: &str| {
            let files = [("h.cfg".to_owned(), config.as_bytes().to_vec())];
            build(&files, &|_| None).server_state_path()
        };
        let p = |s: &str| Some(std::path::PathBuf::from(s));
        assert_eq!(path("global\n"), None);
        assert_eq!(path("global\n server-state-file /a/state\n"), p("/a/state"));
        assert_eq!(path("global\n server-state-file state\n"), p("state"));
        assert_eq!(
            path("global\n server-state-base /var/lib/haproxy\n server-state-file state\n"),
            p("/var/lib/haproxy/state")
        );
        assert_eq!(
            path("global\n server-state-base /b/\n server-state-file s\n"),
            p("/b/s")
        );
        assert_eq!(
            path("global\n server-state-base /b\n server-state-file /abs\n"),
            p("/abs")
        );
        // Only global's lines count; the first one wins, as in haproxy.
        assert_eq!(path("global\n server-state-file /x\n server-state-file /y\nbackend be\n server-state-file /z\n"), p("/x"));
        assert_eq!(
            path("global\n server-state-base /b\n server-state-base /c\n server-state-file s\n"),
            p("/b/s")
        );
        let refused = build(
            &[(
                "h.cfg".into(),
                b"defaults\n load-server-state-from-file yes\n".to_vec(),
            )],
            &|_| None,
        );
        assert_eq!(
            refused.errors[0].message,
            "'load-server-state-from-file' expects 'global', 'local' or 'none'"
        );
    }

    #[test]
    fn a_time_haproxy_cannot_read_is_refused() {
        for (line, refused) in [
            (
                "agent-inter 2s inter 100ms fastinter 1 downinter 1m slowstart 30s",
                false,
            ),
            ("agent-inter abc", true),
            ("inter 1s2", true),
            ("slowstart ${X}", true),
            ("agent-inter \"\"", false),
        ] {
            let config = format!("backend be\n server s1 a:1 {line}\n");
            let m = build(&[("h.cfg".into(), config.into_bytes())], &|_| None);
            let got: Vec<&str> = m.errors.iter().map(|e| e.message.as_str()).collect();
            assert_eq!(got.contains(&BAD_TIME), refused, "{line}: {got:?}");
        }
    }
}
