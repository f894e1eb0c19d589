//! The agent's metric series the tests and benches read, by name (one
//! spelling for all of them).

/// State swaps: a KV change applied.
pub const SWAPS: &str = "gitlab_haproxy_agent_state_swaps_total";

/// Bytes read from consul (what consul served).
pub const RECEIVED_BYTES: &str = "gitlab_haproxy_agent_consul_received_bytes_total";

/// Consul reads that failed, for `reason`.
pub fn errors(reason: &str) -> String {
    format!("gitlab_haproxy_agent_consul_errors_total{{reason=\"{reason}\"}}")
}

/// Agent checks answered with `outcome`.
pub fn outcome(o: &str) -> String {
    format!("gitlab_haproxy_agent_requests_total{{outcome=\"{o}\"}}")
}
