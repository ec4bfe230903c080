//! `explain --identity`: a caller named as the gateway names it
//! (`key:ID`, `user:SUB`, `tenant:NAME`), explained without its
//! credentials: with hashed API keys in the config an operator has no
//! secret to send, and should not need a customer's.

use std::net::IpAddr;
use std::sync::Arc;

use crate::identity::{Identity, Resolver, Tier};

/// Why `--identity` names no caller of this config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamedError {
    #[error("--identity {0:?}: want key:ID, user:SUB or tenant:NAME")]
    Shape(String),
    #[error("--identity {0:?}: no [[identity.api_keys]] entry has id (or, without an id, tenant) {1:?}")]
    NoKey(String, String),
    #[error("--identity {0:?}: no [[identity.api_keys]] entry has tenant {1:?}")]
    NoTenant(String, String),
    #[error("--identity {0:?}: no [identity.jwt] is configured, so no request has a user identity")]
    NoJwt(String),
}

/// A caller named on the command line, as the config knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Named {
    pub tier: Tier,
    /// `tier:value`, as the limiter keys it.
    pub value: String,
    pub tenant: Option<Arc<str>>,
    pub plan: Option<Arc<str>>,
}

impl Named {
    /// The identity a request from `client_ip` has as this caller.
    pub fn identity(&self, client_ip: IpAddr) -> Identity {
        Identity {
            tier: self.tier,
            value: self.value.clone(),
            tenant: self.tenant.clone(),
            plan: self.plan.clone(),
            rates: None,
            client_ip,
        }
    }
}

/// The caller `spec` names under `resolver`'s config:
/// - `key:ID`: the API key whose id is ID (a key without an id is named
///   by its tenant, as the gateway names it), with its tenant and plan;
/// - `tenant:NAME`: the tenant's first API key, so its plan applies;
/// - `user:SUB`: a JWT's subject (tenant and plan come from a token's
///   claims, which the command line does not have: none).
pub fn named(resolver: &Resolver, spec: &str) -> Result<Named, NamedError> {
    let (tier, value) = spec
        .split_once(':')
        .filter(|(_, v)| !v.is_empty())
        .ok_or_else(|| NamedError::Shape(spec.to_string()))?;
    let of_key = |k: &crate::identity::ApiKey| {
        let name = k.id.as_deref().or(k.tenant.as_deref()).unwrap_or("anonymous");
        Named {
            tier: Tier::Key,
            value: format!("key:{name}"),
            tenant: k.tenant.clone(),
            plan: k.plan.clone(),
        }
    };
    match tier {
        "key" => resolver
            .api_keys
            .iter()
            .find(|k| k.id.as_deref().or(k.tenant.as_deref()) == Some(value))
            .map(of_key)
            .ok_or_else(|| NamedError::NoKey(spec.to_string(), value.to_string())),
        "tenant" => resolver
            .api_keys
            .iter()
            .find(|k| k.tenant.as_deref() == Some(value))
            .map(of_key)
            .ok_or_else(|| NamedError::NoTenant(spec.to_string(), value.to_string())),
        "user" if resolver.jwt.is_some() => Ok(Named {
            tier: Tier::User,
            value: spec.to_string(),
            tenant: None,
            plan: None,
        }),
        "user" => Err(NamedError::NoJwt(spec.to_string())),
        _ => Err(NamedError::Shape(spec.to_string())),
    }
}
