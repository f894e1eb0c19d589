//! Decoding the body of `GET /v1/kv/<prefix>/?recurse` (pure).
//!
//! In: the complete response body (a JSON array of consul `DirEntry`
//! objects; compact or pretty; unknown fields ignored). Out: the entries with
//! their values base64-decoded (`Value: null` is an empty value). Always
//! holds: any byte input returns `Ok` or `Err`, never panics; the work is
//! linear in the input.

/// One KV entry as consul sends it, value decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvPair {
    pub key: String,
    /// The decoded value; empty for `Value: null`.
    pub value: Vec<u8>,
    pub modify_index: u64,
}

/// Why a body could not be decoded (metric reason `bad_body`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError(pub String);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Decodes a recurse listing. An empty body is an error here: the caller
/// handles the 404 (empty prefix) before decoding.
pub fn decode_list(body: &[u8]) -> Result<Vec<KvPair>, DecodeError> {
    todo!("{body:?}")
}
