//! Control-plane authentication: `X-API-Key` → team.
//!
//! Every key belongs to one team, and a team sees and touches only its own
//! sandboxes. Keys are compared in constant time so response timing does not
//! reveal how much of a guessed key was right.

use crate::error::ApiError;
use http::HeaderMap;
use std::collections::HashMap;
use std::sync::Arc;
use warren_core::headers::API_KEY;

/// The team a request acts for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Team(pub String);

/// Configured API keys.
#[derive(Debug, Clone, Default)]
pub struct ApiKeys {
    /// key → team id.
    keys: Arc<HashMap<String, String>>,
}

impl ApiKeys {
    /// Adds a key; rejects empty keys and teams, whitespace, and a key given
    /// twice for different teams.
    pub fn insert(&mut self, key: &str, team: &str) -> Result<(), String> {
        if key.is_empty() || team.is_empty() {
            return Err("API key and team must both be non-empty".into());
        }
        if key.chars().any(char::is_whitespace) || team.chars().any(char::is_whitespace) {
            return Err("API keys and teams cannot contain whitespace".into());
        }
        let keys = Arc::make_mut(&mut self.keys);
        match keys.get(key) {
            Some(existing) if existing != team => Err(format!(
                "one API key is given for two teams ({existing}, {team})"
            )),
            _ => {
                keys.insert(key.to_string(), team.to_string());
                Ok(())
            }
        }
    }

    /// True when no key is configured.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// How many keys there are (for `--check-config`'s report).
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// The team owning `key`, if any.
    pub fn team(&self, key: &str) -> Option<&str> {
        // Compare against every key in constant time per key; the number of
        // configured keys is small and not secret.
        let mut found = None;
        for (k, team) in self.keys.iter() {
            if constant_time_eq(k.as_bytes(), key.as_bytes()) {
                found = Some(team.as_str());
            }
        }
        found
    }

    /// Authenticates a request by its `X-API-Key` header.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Team, ApiError> {
        let Some(value) = headers.get(API_KEY) else {
            return Err(ApiError::unauthorized(
                "missing API key: send it in the X-API-Key header",
            ));
        };
        let key = value
            .to_str()
            .map_err(|_| ApiError::unauthorized("invalid API key"))?;
        match self.team(key.trim()) {
            Some(team) => Ok(Team(team.to_string())),
            None => Err(ApiError::unauthorized("invalid API key")),
        }
    }
}

pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn authenticates_by_header() {
        let mut keys = ApiKeys::default();
        keys.insert("secret", "team-a")
            .unwrap_or_else(|e| panic!("{e}"));
        let mut h = HeaderMap::new();
        assert_eq!(keys.authenticate(&h).unwrap_err().status.as_u16(), 401);
        h.insert(API_KEY, http::HeaderValue::from_static("wrong"));
        assert_eq!(keys.authenticate(&h).unwrap_err().status.as_u16(), 401);
        h.insert(API_KEY, http::HeaderValue::from_static("secret"));
        assert_eq!(keys.authenticate(&h).ok(), Some(Team("team-a".into())));
        assert!(keys.insert("secret", "team-b").is_err());
    }
}
