//! The consul rig the consul tests share: the agent watching a KV through
//! the fault proxy, under a prefix of its own. Each test module adds its own
//! setup (the keys it syncs on) and fault checks in an `impl Rig` of its own.

use std::time::Duration;

use super::proxy::{Mode, Proxy};
use super::{wait_for, Agent, Kv};

/// Agent → proxy → KV. Fields drop in order: the agent first, "consul"
/// last.
pub struct Rig {
    pub agent: Agent,
    pub proxy: Proxy,
    pub kv: Kv,
    pub prefix: String,
}

impl Rig {
    /// The agent (`-consul-wait 1s`, then `extra`) started with the proxy
    /// already in `mode`; not waited on.
    pub fn start(kv: Kv, prefix: String, mode: Mode, extra: &[&str]) -> Rig {
        let proxy = Proxy::start(kv.addr);
        proxy.set_mode(mode);
        let mut args = vec!["-consul-wait", "1s"];
        args.extend_from_slice(extra);
        let agent = Agent::with_consul(proxy.addr, &prefix, &args);
        Rig {
            agent,
            proxy,
            kv,
            prefix,
        }
    }

    /// Writes `value` for `identity` under the rig's prefix.
    pub fn put(&self, identity: &str, value: &str) {
        self.kv.put(&format!("{}/{identity}", self.prefix), value);
    }

    pub fn metric(&self, series: &str) -> f64 {
        self.agent.metric(series)
    }

    /// Waits until `series` is at least `at_least`; returns its value.
    pub fn wait_metric(&self, series: &str, at_least: f64, limit: Duration) -> f64 {
        wait_for(limit, &format!("{series} >= {at_least}"), || {
            let v = self.metric(series);
            (v >= at_least).then_some(v)
        })
    }
}
