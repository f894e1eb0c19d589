//! The agent's metric series the tests read, by name (one spelling for
//! every test module).

/// State swaps: a KV change applied.
pub const SWAPS: &str = "gitlab_haproxy_agent_state_swaps_total";

/// Consul reads that failed, for `reason`.
pub fn errors(reason: &str) -> String {
    format!("gitlab_haproxy_agent_consul_errors_total{{reason=\"{reason}\"}}")
}

/// Agent checks answered with `outcome`.
pub fn outcome(o: &str) -> String {
    format!("gitlab_haproxy_agent_requests_total{{outcome=\"{o}\"}}")
}
