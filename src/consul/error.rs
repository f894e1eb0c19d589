//! Why a request to consul failed: the reason (a fixed metric label) and a
//! one-line detail, shown only through [`crate::safe`]. A leaf: the watch,
//! the transport steps, TLS, the watch's health and the writers' exchanges
//! all name failures with it.

use crate::labels::label_enum;

label_enum! {
    /// Why a consul request failed (metric label `reason`, fixed: dashboards
    /// outlive refactors).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub enum ErrorReason {
        Connect => "connect",
        Timeout => "timeout",
        Reset => "reset",
        Http4xx => "http_4xx",
        Http5xx => "http_5xx",
        BadIndex => "bad_index",
        BadBody => "bad_body",
        TooLarge => "too_large",
        Tls => "tls",
    }
}

/// A failed request: the reason and a one-line detail for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub reason: ErrorReason,
    pub detail: String,
    /// Consul refused the request as asked (a redirect, a bad prefix,
    /// token, namespace or partition): the operator must act. Logged at
    /// error level and retried no faster than [`super::watch::CONFIG_ERROR_DELAY`].
    pub configuration: bool,
}

impl Failure {
    pub fn new(reason: ErrorReason, detail: impl Into<String>) -> Failure {
        Failure {
            reason,
            detail: detail.into(),
            configuration: false,
        }
    }

    /// The failure of a complete response that is not a listing (`None`
    /// for 200 and 404, which are).
    pub(super) fn of_status(status: u16, body: &[u8], secrets: &[Vec<u8>]) -> Option<Failure> {
        let (reason, configuration) = match status {
            200 | 404 => return None,
            // Interim responses are skipped by the client; any other 2xx
            // carries no listing.
            100..=299 => (ErrorReason::BadBody, false),
            // Throttled or timed out: consul is busy, not misconfigured.
            408 | 429 => (ErrorReason::Http4xx, false),
            300..=499 => (ErrorReason::Http4xx, true),
            _ => (ErrorReason::Http5xx, false),
        };
        Some(Failure {
            reason,
            detail: http_detail(status, body, secrets),
            configuration,
        })
    }
}

fn http_detail(status: u16, body: &[u8], secrets: &[Vec<u8>]) -> String {
    let text = crate::safe::error_body(body, secrets);
    if text.is_empty() {
        format!("HTTP {status}")
    } else {
        format!("HTTP {status}: {text}")
    }
}
