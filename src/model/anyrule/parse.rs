//! [`parse_rule`]: a saved rule's argument tokens to a [`Match`] and a [`Target`]. Whatever is
//! not modelled becomes an opaque [`Cond::Other`] of the option's tokens.

use std::rc::Rc;

use super::{Cond, Match, PortSet, Target, listed};
use crate::model::rule::IpNet;

/// Extension targets that are not chains; all are [`Target::Other`].
const EXTENSION_TARGETS: &str = "AUDIT CHECKSUM CLASSIFY CLUSTERIP CONNMARK CONNSECMARK CT DNPT \
    DSCP ECN HL HMARK IDLETIMER LED LOG MARK NETMAP NFLOG NFQUEUE NOTRACK QUEUE RATEEST SECMARK \
    SET SNPT SYNPROXY TCPMSS TCPOPTSTRIP TEE TOS TPROXY TRACE TTL ULOG";
const ADDR_TYPES: &str = "UNSPEC UNICAST LOCAL BROADCAST ANYCAST MULTICAST BLACKHOLE UNREACHABLE PROHIBIT THROW NAT XRESOLVE";
const PORT_MODULES: &str = "tcp udp sctp dccp";
/// Options whose one value is free text (which could look like an option, `--string -s`).
const FREE_TEXT: &str =
    "--string --hex-string --u32 --bytecode --comment --log-prefix --nflog-prefix --ulog-prefix";

/// Parse a saved rule's arguments (the tokens after `-A CHAIN`). Never fails: whatever is not
/// understood becomes [`Cond::Other`] (so it can only make coverage less likely).
pub fn parse_rule(args: &[String]) -> (Match, Target) {
    let mut p = Parser::default();
    let mut i = 0;
    while i < args.len() {
        let (mut negated, mut tok) = (false, args[i].as_str());
        i += 1;
        if tok == "!" {
            let Some(next) = args.get(i) else {
                p.close();
                p.conds.push(Cond::Other("!".into()));
                break;
            };
            (negated, tok) = (true, next);
            i += 1;
        }
        let context = match tok {
            "-m" | "--match" => Some("-m"),
            "-j" | "--jump" => Some("-j"),
            "-g" | "--goto" => Some("-g"),
            _ => None,
        };
        if let Some(kind) = basic_option(tok) {
            p.close();
            p.in_target = false;
            i = p.basic(kind, negated, args, i);
        } else if let Some(opt) = context {
            i = p.module_or_target(opt, negated, args, i);
        } else if p.in_target {
            i = p.target_option(tok, args, i);
        } else {
            i = p.option(negated, tok, args, i);
        }
    }
    p.close();
    let target = p.target();
    (Match { conds: p.conds }, target)
}

impl Parser {
    /// `-m NAME`, `-j NAME` or `-g NAME` (`opt`), its value at `args[i]`; the index after it.
    fn module_or_target(
        &mut self,
        opt: &str,
        negated: bool,
        args: &[String],
        mut i: usize,
    ) -> usize {
        self.close();
        let value = args.get(i).map(String::as_str);
        i += usize::from(value.is_some());
        if negated {
            self.conds
                .push(Cond::Other(render(["!", opt, value.unwrap_or("")])));
        }
        self.in_target = opt != "-m";
        match value {
            Some(name) if opt == "-m" => self.open(name),
            None if opt == "-m" => self.conds.push(Cond::Other("-m".into())),
            name if self.target.is_none() => {
                self.target = Some((opt == "-g", name.unwrap_or("").into()))
            }
            _ => self.two_targets = true,
        }
        i
    }

    /// An option `tok` of the target, its value at `args[i]`; the index after it.
    fn target_option(&mut self, tok: &str, args: &[String], mut i: usize) -> usize {
        // Target options do not affect matching; only these three are kept.
        if listed(FREE_TEXT, tok) {
            i += 1;
        }
        let key = ["--to-destination", "--to-source", "--to-ports"]
            .into_iter()
            .find(|k| *k == tok);
        if let (Some(key), Some(v)) = (key, args.get(i)) {
            i += 1;
            if !self.target_opts.iter().any(|(k, _)| *k == key) {
                self.target_opts.push((key, v.clone()));
            }
        }
        i
    }

    /// The target read, with the options kept for it.
    fn target(&self) -> Target {
        let p = self;
        let opt = |key: &str| {
            p.target_opts
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, v)| v.clone())
        };
        match p.target.clone() {
            None => Target::None,
            // A second `-j` is most likely free text misread: trust neither.
            Some((_, name)) if p.two_targets => Target::Other(name),
            Some((true, chain)) => Target::Goto(chain),
            Some((false, name)) => match name.as_str() {
                "ACCEPT" => Target::Accept,
                "DROP" => Target::Drop,
                "RETURN" => Target::Return,
                "REJECT" => Target::Reject,
                "DNAT" => Target::Dnat {
                    to: opt("--to-destination").unwrap_or_default(),
                },
                "SNAT" => Target::Snat {
                    to: opt("--to-source").unwrap_or_default(),
                },
                "REDIRECT" => Target::Redirect {
                    to_ports: opt("--to-ports"),
                },
                "MASQUERADE" => Target::Masquerade,
                n if n.is_empty() || listed(EXTENSION_TARGETS, n) => Target::Other(name),
                _ => Target::Jump(name),
            },
        }
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Basic {
    Proto,
    Src,
    Dst,
    In,
    Out,
    Frag,
}

fn basic_option(tok: &str) -> Option<Basic> {
    Some(match tok {
        "-p" | "--protocol" => Basic::Proto,
        "-s" | "--source" | "--src" => Basic::Src,
        "-d" | "--destination" | "--dst" => Basic::Dst,
        "-i" | "--in-interface" => Basic::In,
        "-o" | "--out-interface" => Basic::Out,
        "-f" | "--fragment" => Basic::Frag,
        _ => return None,
    })
}

/// Where tokens belong: `-m NAME` and `-j`/`-g` open contexts that last until the next one
/// or the next basic option.
#[derive(Default)]
struct Parser {
    conds: Vec<Cond>,
    module: Option<Module>,
    in_target: bool,
    /// (is goto, name) of the first `-j`/`-g`.
    target: Option<(bool, String)>,
    target_opts: Vec<(&'static str, String)>,
    two_targets: bool,
}

/// An open `-m NAME` and what it has produced so far.
struct Module {
    name: String,
    tokens: Vec<String>,
    conds: Vec<Cond>,
    /// The whole module is one [`Cond::Other`] of its tokens.
    opaque: bool,
}

impl Parser {
    fn open(&mut self, name: &str) {
        let known = listed(PORT_MODULES, name) || listed("multiport addrtype comment", name);
        let tokens = vec!["-m".into(), name.into()];
        self.module = Some(Module {
            name: name.into(),
            tokens,
            conds: Vec::new(),
            opaque: !known,
        });
    }

    fn close(&mut self) {
        match self.module.take() {
            Some(m) if m.opaque => self
                .conds
                .push(Cond::Other(render(m.tokens.iter().map(String::as_str)))),
            Some(m) => self.conds.extend(m.conds),
            None => {}
        }
    }

    /// `-p`, `-s`, `-d`, `-i`, `-o`, `-f`; `i` is the index after the option. Returns the next.
    fn basic(&mut self, kind: Basic, mut negated: bool, args: &[String], mut i: usize) -> usize {
        let name = ["-p", "-s", "-d", "-i", "-o", "-f"][kind as usize];
        let mut value = if kind == Basic::Frag {
            None
        } else {
            args.get(i).map(String::as_str)
        };
        i += usize::from(value.is_some());
        if value == Some("!") {
            // The pre-1.4.3 spelling `-s ! 10.0.0.0/8`.
            negated = !negated;
            value = args.get(i).map(String::as_str);
            i += usize::from(value.is_some());
        }
        let other = Cond::Other(render([
            if negated { "!" } else { "" },
            name,
            value.unwrap_or(""),
        ]));
        let value = value.unwrap_or("");
        let cond = match kind {
            _ if value.is_empty() => other,
            Basic::Proto => match value.to_ascii_lowercase() {
                p if (p == "all" || p == "0") && !negated => return i,
                p if p == "all" || p == "0" => other,
                proto => Cond::Protocol { negated, proto },
            },
            Basic::Src | Basic::Dst => match value.parse::<IpNet>() {
                Ok(net) if kind == Basic::Src => Cond::Src { negated, net },
                Ok(net) => Cond::Dst { negated, net },
                Err(_) => other,
            },
            Basic::In => Cond::InIface {
                negated,
                name: value.into(),
            },
            Basic::Out => Cond::OutIface {
                negated,
                name: value.into(),
            },
            Basic::Frag => other,
        };
        self.conds.push(cond);
        i
    }

    /// The module of a port option outside any `-m`: `-p tcp --dport 80` as typed, where
    /// iptables loads `-m tcp` implicitly (empty when there is no such protocol).
    fn implicit_module(&self) -> String {
        self.conds
            .iter()
            .rev()
            .find_map(|c| match c {
                Cond::Protocol {
                    negated: false,
                    proto,
                } if listed(PORT_MODULES, proto) => Some(proto.clone()),
                _ => None,
            })
            .unwrap_or_default()
    }

    /// Any other option outside a target; `i` is the index after it. Returns the next.
    fn option(&mut self, negated: bool, tok: &str, args: &[String], i: usize) -> usize {
        let bang = if negated { "!" } else { "" };
        let module = match &mut self.module {
            Some(m) if m.opaque => {
                let free_text = args.get(i).filter(|_| listed(FREE_TEXT, tok));
                let tokens = [bang, tok, free_text.map_or("", String::as_str)];
                m.tokens.extend(
                    tokens
                        .into_iter()
                        .filter(|t| !t.is_empty())
                        .map(String::from),
                );
                return i + usize::from(free_text.is_some());
            }
            Some(m) => m.name.clone(),
            None => self.implicit_module(),
        };
        let modelled = modelled(&module, negated, tok, args.get(i));
        let end = if modelled.is_some() {
            i + 1
        } else {
            values_end(args, i)
        };
        let mut tokens: Vec<&str> = vec![bang, tok];
        tokens.extend(args[i.min(args.len())..end].iter().map(String::as_str));
        tokens.retain(|t| !t.is_empty());
        let in_module = self.module.is_some();
        // An addrtype or comment option not modelled may qualify the others: all opaque.
        let opaque =
            modelled.is_none() && in_module && (module == "addrtype" || module == "comment");
        let cond = match modelled {
            Some(cond) => cond,
            None if opaque => None,
            None if in_module => Some(Cond::Other(render(
                ["-m", &module].into_iter().chain(tokens.iter().copied()),
            ))),
            None => Some(Cond::Other(render(tokens.iter().copied()))),
        };
        match &mut self.module {
            Some(m) => {
                m.tokens.extend(tokens.iter().map(|t| t.to_string()));
                m.conds.extend(cond);
                m.opaque |= opaque;
            }
            None => self.conds.extend(cond),
        }
        end
    }
}

/// The condition of option `tok` (its value `value`) of the match module `module`, when the
/// model has one: `Some(None)`, understood but no condition; `None`, not understood.
fn modelled(
    module: &str,
    negated: bool,
    tok: &str,
    value: Option<&String>,
) -> Option<Option<Cond>> {
    let ports = |v: &str, list: bool| {
        let (dst, multi) = port_option(tok)?;
        (multi == list).then_some(())?;
        let ports = parse_ports(v, list)?;
        Some(Some(if dst {
            Cond::DPorts { negated, ports }
        } else {
            Cond::SPorts { negated, ports }
        }))
    };
    match (module, value) {
        (m, Some(v)) if listed(PORT_MODULES, m) => ports(v, false),
        ("multiport", Some(v)) => ports(v, true),
        ("addrtype", Some(v)) => parse_types(v).and_then(|types| match tok {
            "--dst-type" => Some(Some(Cond::DstType { negated, types })),
            "--src-type" => Some(Some(Cond::SrcType { negated, types })),
            _ => None,
        }),
        ("comment", Some(_)) if tok == "--comment" && !negated => Some(None),
        _ => None,
    }
}

/// For a port option: (is destination, is a multiport list option).
fn port_option(tok: &str) -> Option<(bool, bool)> {
    Some(match tok {
        "--dport" | "--destination-port" => (true, false),
        "--sport" | "--source-port" => (false, false),
        "--dports" | "--destination-ports" => (true, true),
        "--sports" | "--source-ports" => (false, true),
        _ => return None,
    })
}

/// `80`, `80:90`, `:90`, `80:`; with `list`, comma-separated. `None` when anything is off.
pub(crate) fn parse_ports(v: &str, list: bool) -> Option<PortSet> {
    let items: Vec<&str> = if list {
        v.split(',').collect()
    } else {
        vec![v]
    };
    let mut ranges = Vec::with_capacity(items.len());
    for item in items {
        let (a, b) = item.split_once(':').unwrap_or((item, item));
        let a = if a.is_empty() { 0 } else { a.parse().ok()? };
        let b = if b.is_empty() {
            u16::MAX
        } else {
            b.parse().ok()?
        };
        (a <= b).then_some(())?;
        ranges.push((a, b));
    }
    Some(PortSet::new(ranges))
}

fn parse_types(v: &str) -> Option<Vec<String>> {
    let mut types: Vec<String> = v.split(',').map(str::to_ascii_uppercase).collect();
    types.sort();
    types.dedup();
    types.iter().all(|t| listed(ADDR_TYPES, t)).then_some(types)
}

/// The index of the first token from `i` on that looks like an option (or `!`).
fn values_end(args: &[String], i: usize) -> usize {
    let is_option = |t: &&String| {
        *t == "!" || (t.starts_with('-') && !t[1..].starts_with(|c: char| c.is_ascii_digit()))
    };
    let start = i.min(args.len());
    start + args[start..].iter().take_while(|t| !is_option(t)).count()
}

/// Tokens joined by single spaces; empty ones dropped, ones with blanks or quotes quoted.
fn render<'a>(tokens: impl IntoIterator<Item = &'a str>) -> Rc<str> {
    let quote = |t: &str| {
        let plain = !t.contains(|c: char| c.is_whitespace() || c == '"' || c == '\\');
        if plain {
            t.to_string()
        } else {
            format!("{t:?}")
        }
    };
    let tokens: Vec<String> = tokens
        .into_iter()
        .filter(|t| !t.is_empty())
        .map(quote)
        .collect();
    tokens.join(" ").into()
}
