//! The integration tests: one binary (one link of the library), one module
//! a topic, one `support` for all of them (and for the benches).
//!
//! - Run one topic: `cargo test --test it -- haproxy::` (a test's name is
//!   `module::name`; `scripts/test.sh integration` runs them all).
//! - Tests run as threads of one process: nothing here sets the process's
//!   environment, current directory or signal handlers; each test gets its
//!   own ports (`support::free_port`), KV prefix (`support::unique_prefix`)
//!   and temporary files.
//! - `allocator` reads process-wide counters: its test runs itself again,
//!   alone, in a process of its own.

mod support;

// glibc's counters.
#[cfg(target_env = "gnu")]
mod allocator;
mod ci_config;
mod cli;
mod consul_faults;
mod consul_fleet;
mod dev_mode;
mod docs;
mod haproxy;
mod haproxy_lines;
mod haproxy_reload;
mod hostile;
mod kubernetes;
mod lint_haproxy;
mod loop_budget;
mod monitoring;
mod node_consul;
mod notify;
mod prometheus;
mod py_consul;
mod release;
mod reliability;
mod responder;
mod state_file;
mod systemd_unit;
mod tls;
mod wait_drained;
mod writer;
