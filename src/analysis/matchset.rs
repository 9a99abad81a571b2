//! Match sets: does rule A take every packet rule B would?
//!
//! [`parse_rule`] turns the argument tokens of a saved rule (after `-A CHAIN`) into a
//! [`Match`] (a conjunction of [`Cond`]s) and a [`Target`]. [`Match::covers`] and
//! [`Match::is_empty`] are *sound, not complete*: they answer `true` only when certain, so
//! doctor never claims a shadow it cannot prove. Whatever the parser does not model becomes an
//! opaque [`Cond::Other`], which only an identical condition implies.
//!
//! Semantics kept in mind:
//! - Port matches (`tcp`, `udp`, `sctp`, `dccp`, `multiport`) never match non-first fragments,
//!   negated or not, so a port condition is never vacuous (`--dport 0:65535` still needs one).
//! - `-m addrtype` differs by family: IPv4 tests the one route type of the address, IPv6 tests
//!   UNICAST/MULTICAST/UNSPEC as extra requirements and LOCAL/ANYCAST/UNREACHABLE by a route
//!   lookup. Implications are claimed only where they hold in both.
//! - An unknown module's options, or an `addrtype` with an option not modelled
//!   (`--limit-iface-in`), stay together as one [`Cond::Other`]: options can qualify each
//!   other (`--limit-burst`), so splitting them would not be sound. The options of `tcp`,
//!   `udp`, `sctp`, `dccp` and `multiport` are independent and become one condition each.
//! - Both rules are assumed to come from the same table and family.

use std::net::IpAddr;
use std::rc::Rc;

use crate::rule::IpNet;

/// One condition of a rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Cond {
    /// `-p`: lower-case name or number as printed (`tcp`, `47`); `all`/`0` is no condition.
    Protocol { negated: bool, proto: String },
    /// `-s`
    Src { negated: bool, net: IpNet },
    /// `-d`
    Dst { negated: bool, net: IpNet },
    /// `-i`; a trailing `+` matches every name with that prefix.
    InIface { negated: bool, name: String },
    /// `-o`; a trailing `+` matches every name with that prefix.
    OutIface { negated: bool, name: String },
    /// `--dport`/`--dports`/`--destination-port(s)` of `tcp`, `udp`, `sctp`, `dccp`, `multiport`.
    DPorts { negated: bool, ports: PortSet },
    /// `--sport`/`--sports`/`--source-port(s)`.
    SPorts { negated: bool, ports: PortSet },
    /// `-m addrtype --dst-type LOCAL,UNICAST` (sorted, upper-case).
    DstType { negated: bool, types: Vec<String> },
    /// `-m addrtype --src-type ...` (sorted, upper-case).
    SrcType { negated: bool, types: Vec<String> },
    /// Anything not modelled (e.g. `-m mark --mark 0x1`, `-m conntrack --ctstate NEW`,
    /// `-m set --match-set x dst`, `-f`): the exact tokens of that option and its module,
    /// `--match` written `-m`, joined by single spaces (tokens with blanks or quotes quoted).
    /// Shared, not copied, by the conditions of every path through the rule (it can be long:
    /// `-m bpf --bytecode`, `-m string --hex-string`).
    Other(Rc<str>),
}

/// A set of ports as sorted, merged inclusive ranges.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PortSet(pub Vec<(u16, u16)>);

/// What a rule matches: the conjunction of its conditions (empty = every packet).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Match {
    pub conds: Vec<Cond>,
}

/// Where a matching packet goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// No `-j`/`-g`: a counting rule, evaluation continues.
    None,
    /// `-j NAME` for any name that is not a known target: a chain (the caller checks it exists).
    Jump(String),
    /// `-g CHAIN`
    Goto(String),
    Accept,
    Drop,
    Return,
    /// With or without `--reject-with`.
    Reject,
    /// The first `--to-destination` value (empty if none).
    Dnat {
        to: String,
    },
    /// `--to-ports`, if given.
    Redirect {
        to_ports: Option<String>,
    },
    Masquerade,
    /// The first `--to-source` value (empty if none).
    Snat {
        to: String,
    },
    /// Targets that do not end evaluation (MARK, LOG, CONNMARK, CT, NOTRACK, TRACE, ...), the
    /// other extension targets (NETMAP, NFQUEUE, TPROXY, ...) and `-j` without a name: name only.
    Other(String),
}

/// Extension targets that are not chains; all are [`Target::Other`].
const EXTENSION_TARGETS: &str = "AUDIT CHECKSUM CLASSIFY CLUSTERIP CONNMARK CONNSECMARK CT DNPT \
    DSCP ECN HL HMARK IDLETIMER LED LOG MARK NETMAP NFLOG NFQUEUE NOTRACK QUEUE RATEEST SECMARK \
    SET SNPT SYNPROXY TCPMSS TCPOPTSTRIP TEE TOS TPROXY TRACE TTL ULOG";
const ADDR_TYPES: &str = "UNSPEC UNICAST LOCAL BROADCAST ANYCAST MULTICAST BLACKHOLE UNREACHABLE PROHIBIT THROW NAT XRESOLVE";
/// Types IPv6 looks up in the routing table (a set of them is a union there too).
const LOOKUP_TYPES: &str = "LOCAL ANYCAST UNREACHABLE";
/// Types ip6tables refuses: a rule naming one is IPv4, where a set is a plain union.
const V4_ONLY_TYPES: &str = "BROADCAST BLACKHOLE PROHIBIT THROW NAT XRESOLVE";
const PORT_MODULES: &str = "tcp udp sctp dccp";
/// Options whose one value is free text (which could look like an option, `--string -s`).
const FREE_TEXT: &str =
    "--string --hex-string --u32 --bytecode --comment --log-prefix --nflog-prefix --ulog-prefix";

fn listed(list: &str, word: &str) -> bool {
    list.split_whitespace().any(|w| w == word)
}

impl Target {
    /// Whether a packet this rule matches stops being evaluated in this table's hook here
    /// (ACCEPT, DROP, REJECT, DNAT, REDIRECT, MASQUERADE, SNAT). RETURN is not terminal (the
    /// caller handles it); neither are jumps, gotos and [`Target::Other`].
    pub fn is_terminal(&self) -> bool {
        use Target::*;
        matches!(
            self,
            Accept | Drop | Reject | Dnat { .. } | Redirect { .. } | Masquerade | Snat { .. }
        )
    }
}

impl PortSet {
    /// The union of inclusive ranges, sorted and merged; a range with `first > last` is empty
    /// (as the kernel treats it).
    pub fn new(ranges: Vec<(u16, u16)>) -> PortSet {
        let mut ranges: Vec<(u16, u16)> = ranges.into_iter().filter(|(a, b)| a <= b).collect();
        ranges.sort_unstable();
        let mut out: Vec<(u16, u16)> = Vec::with_capacity(ranges.len());
        for (a, b) in ranges {
            match out.last_mut() {
                Some(last) if u32::from(a) <= u32::from(last.1) + 1 => last.1 = last.1.max(b),
                _ => out.push((a, b)),
            }
        }
        PortSet(out)
    }

    /// Every port not in the set.
    pub fn complement(&self) -> PortSet {
        let (mut out, mut next) = (Vec::new(), 0u32);
        for (a, b) in PortSet::new(self.0.clone()).0 {
            if u32::from(a) > next {
                out.push((next as u16, a - 1));
            }
            next = u32::from(b) + 1;
        }
        if next <= u32::from(u16::MAX) {
            out.push((next as u16, u16::MAX));
        }
        PortSet(out)
    }

    /// The ports in both sets.
    pub fn intersection(&self, other: &PortSet) -> PortSet {
        let (x, y) = (
            PortSet::new(self.0.clone()).0,
            PortSet::new(other.0.clone()).0,
        );
        let (mut i, mut j, mut out) = (0, 0, Vec::new());
        while i < x.len() && j < y.len() {
            let (lo, hi) = (x[i].0.max(y[j].0), x[i].1.min(y[j].1));
            if lo <= hi {
                out.push((lo, hi));
            }
            if x[i].1 < y[j].1 { i += 1 } else { j += 1 }
        }
        PortSet(out)
    }

    /// Whether every port of `self` is in `other`.
    pub fn is_subset(&self, other: &PortSet) -> bool {
        self.intersection(other) == PortSet::new(self.0.clone())
    }

    pub fn is_empty(&self) -> bool {
        self.0.iter().all(|(a, b)| a > b)
    }
}

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
            p.close();
            let value = args.get(i).map(String::as_str);
            i += usize::from(value.is_some());
            if negated {
                p.conds
                    .push(Cond::Other(render(["!", opt, value.unwrap_or("")])));
            }
            p.in_target = opt != "-m";
            match value {
                Some(name) if opt == "-m" => p.open(name),
                None if opt == "-m" => p.conds.push(Cond::Other("-m".into())),
                name if p.target.is_none() => {
                    p.target = Some((opt == "-g", name.unwrap_or("").into()))
                }
                _ => p.two_targets = true,
            }
        } else if p.in_target {
            // Target options do not affect matching; only these three are kept.
            if listed(FREE_TEXT, tok) {
                i += 1;
            }
            let key = ["--to-destination", "--to-source", "--to-ports"]
                .into_iter()
                .find(|k| *k == tok);
            if let (Some(key), Some(v)) = (key, args.get(i)) {
                i += 1;
                if !p.target_opts.iter().any(|(k, _)| *k == key) {
                    p.target_opts.push((key, v.clone()));
                }
            }
        } else {
            i = p.option(negated, tok, args, i);
        }
    }
    p.close();
    let opt = |key: &str| {
        p.target_opts
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.clone())
    };
    let target = match p.target.clone() {
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
    };
    (Match { conds: p.conds }, target)
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
            // `-p tcp --dport 80` as typed: iptables loads `-m tcp` implicitly.
            None => self
                .conds
                .iter()
                .rev()
                .find_map(|c| match c {
                    Cond::Protocol {
                        negated: false,
                        proto,
                    } if listed(PORT_MODULES, proto) => Some(proto.clone()),
                    _ => None,
                })
                .unwrap_or_default(),
        };
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
        // Some(None): understood, no condition.
        let modelled: Option<Option<Cond>> = match (module.as_str(), args.get(i)) {
            (m, Some(v)) if listed(PORT_MODULES, m) => ports(v, false),
            ("multiport", Some(v)) => ports(v, true),
            ("addrtype", Some(v)) => parse_types(v).and_then(|types| match tok {
                "--dst-type" => Some(Some(Cond::DstType { negated, types })),
                "--src-type" => Some(Some(Cond::SrcType { negated, types })),
                _ => None,
            }),
            ("comment", Some(_)) if tok == "--comment" && !negated => Some(None),
            _ => None,
        };
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
fn parse_ports(v: &str, list: bool) -> Option<PortSet> {
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

/// A condition taken apart: (field, negated, value). Conditions on the same field compare.
enum Val<'a> {
    Proto(&'a str),
    Net(&'a IpNet),
    Iface(&'a str),
    Ports(&'a PortSet),
    Types(&'a [String]),
    Other(&'a str),
}

fn parts(c: &Cond) -> (u8, bool, Val<'_>) {
    match c {
        Cond::Protocol { negated, proto } => (0, *negated, Val::Proto(proto)),
        Cond::Src { negated, net } => (1, *negated, Val::Net(net)),
        Cond::Dst { negated, net } => (2, *negated, Val::Net(net)),
        Cond::InIface { negated, name } => (3, *negated, Val::Iface(name)),
        Cond::OutIface { negated, name } => (4, *negated, Val::Iface(name)),
        Cond::DPorts { negated, ports } => (5, *negated, Val::Ports(ports)),
        Cond::SPorts { negated, ports } => (6, *negated, Val::Ports(ports)),
        Cond::DstType { negated, types } => (7, *negated, Val::Types(types)),
        Cond::SrcType { negated, types } => (8, *negated, Val::Types(types)),
        Cond::Other(x) => (9, false, Val::Other(x)),
    }
}

/// Whether every packet satisfying `b` satisfies `a`.
fn implies(b: &Cond, a: &Cond) -> bool {
    let ((ak, an, a), (bk, bn, b)) = (parts(a), parts(b));
    ak == bk && implies_parts((bn, b), (an, a))
}

/// [`implies`] on parts of the same field (negation flags given separately).
fn implies_parts((bn, b): (bool, Val), (an, a): (bool, Val)) -> bool {
    // From set relations: non-negated b ⊆ a; both negated a ⊆ b; negated a: b disjoint from a.
    fn by_sets<T: ?Sized>(
        an: bool,
        a: &T,
        bn: bool,
        b: &T,
        subset: fn(&T, &T) -> bool,
        disjoint: fn(&T, &T) -> bool,
    ) -> bool {
        match (an, bn) {
            (false, false) => subset(b, a),
            (true, true) => subset(a, b),
            (true, false) => disjoint(a, b),
            (false, true) => false,
        }
    }
    match (a, b) {
        (Val::Proto(a), Val::Proto(b)) => by_sets(
            an,
            a,
            bn,
            b,
            |x, y| x == y || proto_number(x).is_some_and(|n| proto_number(y) == Some(n)),
            |x, y| matches!((proto_number(x), proto_number(y)), (Some(m), Some(n)) if m != n),
        ),
        (Val::Net(a), Val::Net(b)) => {
            by_sets(an, a, bn, b, |x, y| net_contains(y, x), net_disjoint)
        }
        (Val::Iface(a), Val::Iface(b)) => by_sets(an, a, bn, b, iface_subset, iface_disjoint),
        (Val::Ports(a), Val::Ports(b)) => effective(bn, b).is_subset(&effective(an, a)),
        (Val::Types(a), Val::Types(b)) => by_sets(an, a, bn, b, types_imply, types_disjoint),
        (Val::Other(a), Val::Other(b)) => a == b && !stateful(a),
        _ => false,
    }
}

/// Modules whose verdict is a fresh draw or a per-rule counter (random sampling, every nth
/// packet, token buckets, quotas, recent lists): two rules with the same such condition do
/// not match the same packets, so an identical condition implies nothing.
const STATEFUL_MODULES: &[&str] = &[
    "statistic",
    "limit",
    "hashlimit",
    "connlimit",
    "quota",
    "quota2",
    "recent",
    "nth",
    "random",
];

fn stateful(other: &str) -> bool {
    let mut tokens = other.split_whitespace();
    while let Some(t) = tokens.next() {
        if (t == "-m" || t == "--match")
            && tokens.next().is_some_and(|m| STATEFUL_MODULES.contains(&m))
        {
            return true;
        }
    }
    false
}

/// Whether every packet satisfies the condition (`-s 0.0.0.0/0`, `-i +`; never ports, see
/// the module comment), with its negation flag replaced by `negated`.
fn vacuous(c: &Cond, negated: bool) -> bool {
    match parts(c) {
        (_, _, Val::Net(net)) => !negated && net.prefix == 0,
        (_, _, Val::Iface(name)) => !negated && name == "+",
        _ => false,
    }
}

fn effective(negated: bool, ports: &PortSet) -> PortSet {
    if negated {
        ports.complement()
    } else {
        PortSet::new(ports.0.clone())
    }
}

/// (bits, width) of an address.
fn addr_bits(addr: IpAddr) -> (u128, u8) {
    match addr {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32),
        IpAddr::V6(a) => (u128::from(a), 128),
    }
}

/// Whether every address of `inner` is in `outer` (never across families).
pub(crate) fn net_contains(outer: &IpNet, inner: &IpNet) -> bool {
    let ((o, ow), (n, nw)) = (addr_bits(outer.addr), addr_bits(inner.addr));
    let (op, ip) = (outer.prefix.min(ow), inner.prefix.min(nw));
    let key = |bits: u128| if op == 0 { 0 } else { bits >> (ow - op) };
    ow == nw && op <= ip && key(o) == key(n)
}

/// Whether no address is in both (within one family prefixes nest or are disjoint).
pub(crate) fn net_disjoint(a: &IpNet, b: &IpNet) -> bool {
    addr_bits(a.addr).1 == addr_bits(b.addr).1 && !net_contains(a, b) && !net_contains(b, a)
}

/// An interface name as a pattern: (literal part, is a `+` prefix).
fn iface(name: &str) -> (&str, bool) {
    name.strip_suffix('+')
        .map_or((name, false), |prefix| (prefix, true))
}

fn iface_subset(inner: &str, outer: &str) -> bool {
    match (iface(inner), iface(outer)) {
        ((i, _), (o, true)) => i.starts_with(o),
        _ => inner == outer,
    }
}

fn iface_disjoint(a: &str, b: &str) -> bool {
    match (iface(a), iface(b)) {
        ((x, false), (y, false)) => x != y,
        ((x, false), (p, true)) | ((p, true), (x, false)) => !x.starts_with(p),
        ((p, true), (q, true)) => !p.starts_with(q) && !q.starts_with(p),
    }
}

/// Whether `--X-type T` implies `--X-type S`, in IPv4 (T ⊆ S) and in IPv6 alike.
fn types_imply(t: &[String], s: &[String]) -> bool {
    let extra: Vec<&String> = s.iter().filter(|x| !t.contains(x)).collect();
    t.iter().all(|x| s.contains(x))
        && (extra.is_empty()
            || s.iter().any(|x| listed(V4_ONLY_TYPES, x))
            || (extra.iter().all(|x| listed(LOOKUP_TYPES, x))
                && t.iter().any(|x| listed(LOOKUP_TYPES, x))))
}

/// Whether no address has both types: claimed only for certainly-IPv4 rules.
fn types_disjoint(a: &[String], b: &[String]) -> bool {
    a.iter().chain(b).any(|x| listed(V4_ONLY_TYPES, x)) && !a.iter().any(|x| b.contains(x))
}

/// The protocol number of a number or of a name iptables prints.
pub(crate) fn proto_number(p: &str) -> Option<u8> {
    let names = "icmp:1 tcp:6 udp:17 dccp:33 gre:47 esp:50 ah:51 icmpv6:58 ipv6-icmp:58 sctp:132 \
        mh:135 ipv6-mh:135 udplite:136";
    let named = names
        .split_whitespace()
        .filter_map(|e| e.split_once(':'))
        .find(|(n, _)| *n == p);
    p.parse()
        .ok()
        .or_else(|| named.and_then(|(_, v)| v.parse().ok()))
}

impl Match {
    /// Every packet `other` matches, `self` matches too. Sound, not complete: false when
    /// unsure. Each condition of `self` must be vacuous or implied by one condition of
    /// `other`; a match that is certainly empty is covered by anything.
    pub fn covers(&self, other: &Match) -> bool {
        let implied =
            |a: &Cond| vacuous(a, parts(a).1) || other.conds.iter().any(|b| implies(b, a));
        self.conds.iter().all(implied) || other.is_empty()
    }

    /// The conjunction of both (the conditions of a jump and of a rule in the chain it jumps
    /// to); conditions already present are not repeated.
    pub fn and(&self, other: &Match) -> Match {
        let mut conds = self.conds.clone();
        for c in &other.conds {
            if !conds.contains(c) {
                conds.push(c.clone());
            }
        }
        Match { conds }
    }

    /// Whether no packet can match (`-p tcp` and `-p udp`; disjoint port sets; two different
    /// host addresses). Sound: true only when certain.
    pub fn is_empty(&self) -> bool {
        // a contradicts b when a implies not-b.
        let contradicts = |a: &Cond, b: &Cond| {
            let ((ak, an, av), (bk, bn, bv)) = (parts(a), parts(b));
            ak == bk && ak != 9 && implies_parts((an, av), (!bn, bv))
        };
        let ports_empty = |field: u8| {
            let sets = self.conds.iter().filter_map(|c| match parts(c) {
                (k, negated, Val::Ports(p)) if k == field => Some(effective(negated, p)),
                _ => None,
            });
            sets.reduce(|x, y| x.intersection(&y))
                .is_some_and(|s| s.is_empty())
        };
        let conds = &self.conds;
        ports_empty(5)
            || ports_empty(6)
            || conds
                .iter()
                .any(|c| parts(c).0 != 9 && vacuous(c, !parts(c).1))
            || conds.iter().enumerate().any(|(i, a)| {
                conds[i + 1..]
                    .iter()
                    .any(|b| contradicts(a, b) || contradicts(b, a))
            })
    }
}

#[cfg(test)]
#[path = "matchset_tests.rs"]
mod tests;
