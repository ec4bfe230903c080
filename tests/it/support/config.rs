//! [`Toml`]: a gateway.toml built up from the skeleton every test shares,
//! so that a test writes only what it is about.

use std::fmt;
use std::ops::Deref;

/// A gateway.toml: `[listeners]` with `http` and `admin` on ephemeral
/// ports, then whatever the test adds. Dereferences to the text, so it
/// goes wherever config text does (`Gateway::start(&toml)`).
///
/// ```ignore
/// let toml = Toml::new()
///     .gateway("workers = 1")
///     .respond("demo", "/", &["five"])
///     .limit("five", "5/min")
///     .with(r#"by = ["header:x-user"]"#);
/// ```
///
/// `[gateway]` and `[listeners]` are written first, whenever their lines
/// were added; every other section in the order it was added.
#[derive(Clone, Debug)]
pub struct Toml {
    gateway: String,
    listeners: String,
    sections: String,
    text: String,
}

impl Default for Toml {
    fn default() -> Toml {
        Toml::new()
    }
}

impl Toml {
    /// `[listeners]` `http` and `admin` on 127.0.0.1, ephemeral ports.
    pub fn new() -> Toml {
        Toml {
            gateway: String::new(),
            listeners: "http = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n".to_string(),
            sections: String::new(),
            text: String::new(),
        }
        .render()
    }

    /// Lines of `[gateway]` (`key = value`, one or more); may be called
    /// again to add more.
    pub fn gateway(mut self, lines: &str) -> Toml {
        push_lines(&mut self.gateway, lines);
        self.render()
    }

    /// More lines of `[listeners]` (`https = ...`).
    pub fn listeners(mut self, lines: &str) -> Toml {
        push_lines(&mut self.listeners, lines);
        self.render()
    }

    /// A `[name]` table (`store`, `store.breaker`, `identity.jwt`, ...)
    /// with `lines` in it.
    pub fn table(self, name: &str, lines: &str) -> Toml {
        self.raw(&format!("[{name}]\n")).with(lines)
    }

    /// `[store]` on the Redis at `url`, plus `lines`.
    pub fn redis(self, url: &str, lines: &str) -> Toml {
        self.table("store", &format!("backend = \"redis\"\nurl = \"{url}\"\n{lines}"))
    }

    /// An `[[upstreams]]` named `name` with one target.
    pub fn upstream(self, name: &str, target: &str) -> Toml {
        self.raw(&format!("[[upstreams]]\nname = \"{name}\"\ntargets = [\"{target}\"]\n"))
    }

    /// A `[[routes]]` entry for `path_prefix` that forwards to `upstream`.
    pub fn forward(self, name: &str, path_prefix: &str, upstream: &str) -> Toml {
        self.raw(&format!(
            "[[routes]]\nname = \"{name}\"\npath_prefix = \"{path_prefix}\"\nupstream = \"{upstream}\"\n"
        ))
    }

    /// A `[[routes]]` entry for `path_prefix` answered by the gateway
    /// itself (`200`, body `ok`), under `limits` (none: no `limits` line).
    pub fn respond(self, name: &str, path_prefix: &str, limits: &[&str]) -> Toml {
        let t = self.raw(&format!(
            "[[routes]]\nname = \"{name}\"\npath_prefix = \"{path_prefix}\"\nresponse = {{ status = 200, body = \"ok\" }}\n"
        ));
        if limits.is_empty() {
            t
        } else {
            let names: Vec<String> = limits.iter().map(|l| format!("\"{l}\"")).collect();
            t.with(&format!("limits = [{}]", names.join(", ")))
        }
    }

    /// A `[[limits]]` entry: `name` at `rate` (`"5/min"`).
    pub fn limit(self, name: &str, rate: &str) -> Toml {
        self.raw(&format!("[[limits]]\nname = \"{name}\"\nrate = \"{rate}\"\n"))
    }

    /// More lines of the section added last (`by = [...]` for a limit,
    /// `on_store_failure = "deny"` for a route, ...).
    pub fn with(mut self, lines: &str) -> Toml {
        push_lines(&mut self.sections, lines);
        self.render()
    }

    /// Text appended as written: whole sections, a shared block of routes
    /// (nothing when empty).
    pub fn raw(mut self, text: &str) -> Toml {
        if text.trim().is_empty() {
            return self;
        }
        if !self.sections.is_empty() {
            self.sections.push('\n');
        }
        self.sections.push_str(text);
        if !text.ends_with('\n') {
            self.sections.push('\n');
        }
        self.render()
    }

    fn render(mut self) -> Toml {
        let mut text = String::new();
        if !self.gateway.is_empty() {
            text.push_str("[gateway]\n");
            text.push_str(&self.gateway);
            text.push('\n');
        }
        text.push_str("[listeners]\n");
        text.push_str(&self.listeners);
        if !self.sections.is_empty() {
            text.push('\n');
            text.push_str(&self.sections);
        }
        self.text = text;
        self
    }
}

/// Appends `lines` (none, one or several, with or without the final
/// newline) to `to`, ending in a newline.
fn push_lines(to: &mut String, lines: &str) {
    let lines = lines.trim_matches('\n');
    if !lines.is_empty() {
        to.push_str(lines);
        to.push('\n');
    }
}

impl Deref for Toml {
    type Target = str;

    fn deref(&self) -> &str {
        &self.text
    }
}

impl AsRef<str> for Toml {
    fn as_ref(&self) -> &str {
        &self.text
    }
}

impl AsRef<[u8]> for Toml {
    fn as_ref(&self) -> &[u8] {
        self.text.as_bytes()
    }
}

impl fmt::Display for Toml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[test]
fn the_skeleton_and_its_sections_in_order() {
    let t = Toml::new()
        .respond("demo", "/", &["a"])
        .gateway("workers = 1")
        .limit("a", "5/min")
        .with("by = [\"route\"]\n")
        .table("identity", "ipv4_prefix = 32")
        .gateway("access_log = \"off\"");
    assert_eq!(
        &*t,
        "[gateway]\nworkers = 1\naccess_log = \"off\"\n\n\
         [listeners]\nhttp = \"127.0.0.1:0\"\nadmin = \"127.0.0.1:0\"\n\n\
         [[routes]]\nname = \"demo\"\npath_prefix = \"/\"\nresponse = { status = 200, body = \"ok\" }\nlimits = [\"a\"]\n\n\
         [[limits]]\nname = \"a\"\nrate = \"5/min\"\nby = [\"route\"]\n\n\
         [identity]\nipv4_prefix = 32\n"
    );
    let config = leasegate::config::parse(std::path::Path::new("gateway.toml"), &t).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(config.limits.len(), 1);
    assert!(config.listeners.http.is_some() && config.listeners.admin.is_some());
}
