//! DNS messages between a guest, the daemon's resolver and the upstream resolver, as
//! pure functions (parsed and written with `hickory-proto`; unit-tested here).
//!
//! Nothing the guest sends goes upstream as it came: the guest's query is read down to
//! its one question (name, type), judged, and a *new* query carrying only that
//! question (a fresh id, recursion desired, EDNS only if the guest used it) is what
//! leaves. So the guest's other bytes (its id, additional records, EDNS options such
//! as client subnet or cookies, odd flags) are no channel out. The upstream's answer is
//! parsed and checked against the question asked (a response, our id, the same
//! question, bounded record counts) before anything of it reaches the guest, and what
//! the guest gets is that answer written anew under the guest's id and question.
use std::net::Ipv4Addr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{DNSClass, RData, RecordType};

/// A guest's query longer than this is dropped unread (a one-question query with EDNS
/// is well under 300 bytes; 1232 is the DNS flag day's safe UDP payload).
pub const MAX_QUERY_BYTES: usize = 1232;
/// An upstream answer (UDP or TCP) longer than this is refused (SERVFAIL to the guest).
/// Queries ask for at most [`UPSTREAM_PAYLOAD`] on UDP; TCP answers may be longer.
pub const MAX_ANSWER_BYTES: usize = 16 * 1024;
/// Records in all sections of an upstream answer, at most.
pub const MAX_ANSWER_RECORDS: usize = 256;
/// The UDP payload size asked of the upstream (and offered to the guest) with EDNS.
pub const UPSTREAM_PAYLOAD: u16 = 1232;
/// Without EDNS a UDP answer may be at most this long (RFC 1035); longer ones are
/// truncated (TC set), and the guest asks again over TCP.
pub const PLAIN_UDP_PAYLOAD: usize = 512;

/// The one question of a guest's query, lower-cased, without the root dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    pub name: String,
    pub qtype: RecordType,
}

/// A guest's query, checked: the question and what is needed to answer it.
#[derive(Debug, Clone)]
pub struct GuestQuery {
    pub question: Question,
    /// The guest's own message (its id, question as written, EDNS).
    message: Message,
}

/// Why a guest's message is not forwarded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// Not even a header: nothing to answer.
    #[error("not a DNS message")]
    Unreadable,
    #[error("{0}")]
    Refused(&'static str),
    #[error("malformed query")]
    Malformed,
}

impl GuestQuery {
    /// Reads a guest's query. `Err` carries the answer to send, if any.
    pub fn parse(bytes: &[u8]) -> Result<GuestQuery, (QueryError, Option<Vec<u8>>)> {
        if bytes.len() > MAX_QUERY_BYTES || bytes.len() < 12 {
            return Err((QueryError::Unreadable, None));
        }
        let message = match Message::from_vec(bytes) {
            Ok(m) => m,
            Err(_) => {
                // The header alone is enough for a FORMERR with the guest's id.
                let id = u16::from_be_bytes([bytes[0], bytes[1]]);
                if bytes[2] & 0x80 != 0 {
                    return Err((QueryError::Unreadable, None));
                }
                let m = Message::error_msg(id, OpCode::Query, ResponseCode::FormErr);
                return Err((QueryError::Malformed, m.to_vec().ok()));
            }
        };
        if message.metadata.message_type != MessageType::Query {
            // Answering a response could loop two resolvers into each other.
            return Err((QueryError::Unreadable, None));
        }
        let refuse = |why: &'static str, code: ResponseCode| {
            let mut m = Message::error_msg(message.metadata.id, message.metadata.op_code, code);
            m.metadata.recursion_desired = message.metadata.recursion_desired;
            if message.queries.len() == 1 {
                m.queries = message.queries.clone();
            }
            (QueryError::Refused(why), m.to_vec().ok())
        };
        if message.metadata.op_code != OpCode::Query {
            return Err(refuse("only standard queries", ResponseCode::NotImp));
        }
        let [query] = message.queries.as_slice() else {
            return Err(refuse("exactly one question", ResponseCode::FormErr));
        };
        if query.query_class() != DNSClass::IN {
            return Err(refuse("only class IN", ResponseCode::Refused));
        }
        let qtype = query.query_type();
        if matches!(
            qtype,
            RecordType::ANY | RecordType::AXFR | RecordType::IXFR | RecordType::OPT
        ) || matches!(qtype, RecordType::Unknown(t) if (128..=255).contains(&t))
        {
            return Err(refuse(
                "no ANY, zone transfers or meta types",
                ResponseCode::Refused,
            ));
        }
        let question = Question {
            name: name_of(query),
            qtype,
        };
        Ok(GuestQuery { question, message })
    }

    /// The answer refusing this query (`REFUSED`: the resolver will not answer it, by
    /// policy; see `super::policy` for why not NXDOMAIN).
    pub fn refused(&self) -> Vec<u8> {
        self.error(ResponseCode::Refused)
    }

    /// The answer saying the upstream could not be asked or answered badly.
    pub fn failed(&self) -> Vec<u8> {
        self.error(ResponseCode::ServFail)
    }

    fn error(&self, code: ResponseCode) -> Vec<u8> {
        let mut m = self.response_shell();
        m.metadata.response_code = code;
        m.to_vec().unwrap_or_default()
    }

    /// An empty NOERROR answer (no records of this type).
    pub fn no_records(&self) -> Vec<u8> {
        self.response_shell().to_vec().unwrap_or_default()
    }

    fn response_shell(&self) -> Message {
        let mut m = Message::response(self.message.metadata.id, OpCode::Query);
        m.metadata.recursion_desired = self.message.metadata.recursion_desired;
        m.metadata.recursion_available = true;
        m.queries = self.message.queries.clone();
        if self.message.edns.is_some() {
            let mut e = Edns::new();
            e.set_max_payload(UPSTREAM_PAYLOAD);
            m.edns = Some(e);
        }
        m
    }

    /// The query sent upstream under `id`: the question alone.
    pub fn upstream_query(&self, id: u16) -> Vec<u8> {
        let mut m = Message::new(id, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.queries = self.message.queries.clone();
        if self.message.edns.is_some() {
            let mut e = Edns::new();
            e.set_max_payload(UPSTREAM_PAYLOAD);
            m.edns = Some(e);
        }
        m.to_vec().unwrap_or_default()
    }

    /// Most bytes a UDP answer to the guest may have.
    pub fn udp_limit(&self) -> usize {
        match &self.message.edns {
            Some(e) => usize::from(e.max_payload().clamp(512, UPSTREAM_PAYLOAD)),
            None => PLAIN_UDP_PAYLOAD,
        }
    }

    /// Checks the upstream's `bytes` against the query sent under `id`. Ok: the answer
    /// for the guest (None: `bytes` is not the answer to this query, e.g. a stray or
    /// forged packet; keep waiting) and the IPv4 addresses in it with their TTLs.
    pub fn check_answer(
        &self,
        id: u16,
        bytes: &[u8],
        udp: bool,
    ) -> Result<Option<Answer>, AnswerError> {
        if bytes.len() > MAX_ANSWER_BYTES {
            return Err(AnswerError::TooLong(bytes.len()));
        }
        let Ok(mut m) = Message::from_vec(bytes) else {
            // Under our id it was meant as the answer: a bad one. Else a stray packet.
            let ours = bytes.len() >= 2 && u16::from_be_bytes([bytes[0], bytes[1]]) == id;
            return if ours {
                Err(AnswerError::Malformed)
            } else {
                Ok(None)
            };
        };
        let same_question = m.queries.len() == 1
            && name_of(&m.queries[0]) == self.question.name
            && m.queries[0].query_type() == self.question.qtype
            && m.queries[0].query_class() == DNSClass::IN;
        if m.metadata.id != id || m.metadata.message_type != MessageType::Response || !same_question
        {
            return Ok(None);
        }
        let records = m.answers.len() + m.authorities.len() + m.additionals.len();
        if records > MAX_ANSWER_RECORDS {
            return Err(AnswerError::TooManyRecords(records));
        }
        let addresses = m
            .answers
            .iter()
            .filter(|r| r.dns_class == DNSClass::IN)
            .filter_map(|r| match &r.data {
                RData::A(a) => Some((a.0, r.ttl)),
                _ => None,
            })
            .collect();
        let code = m.metadata.response_code;
        // The guest's id, question as it wrote it, its EDNS or none.
        m.metadata.id = self.message.metadata.id;
        m.metadata.recursion_desired = self.message.metadata.recursion_desired;
        m.queries = self.message.queries.clone();
        m.signature = None;
        m.edns = self.message.edns.as_ref().map(|_| {
            let mut e = Edns::new();
            e.set_max_payload(UPSTREAM_PAYLOAD);
            e
        });
        let mut bytes = m.to_vec().map_err(|_| AnswerError::Malformed)?;
        if udp && bytes.len() > self.udp_limit() {
            bytes = m.truncate().to_vec().map_err(|_| AnswerError::Malformed)?;
        }
        Ok(Some(Answer {
            bytes,
            addresses,
            code: code.to_string(),
        }))
    }
}

/// An upstream answer, checked, for the guest.
#[derive(Debug, Clone)]
pub struct Answer {
    pub bytes: Vec<u8>,
    /// The A records of the answer section, with their TTLs (seconds).
    pub addresses: Vec<(Ipv4Addr, u32)>,
    /// The response code, as text (`No Error`, `Non-Existent Domain`, ...).
    pub code: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnswerError {
    #[error("the upstream answer has {0} bytes; at most {MAX_ANSWER_BYTES}")]
    TooLong(usize),
    #[error("the upstream answer has {0} records; at most {MAX_ANSWER_RECORDS}")]
    TooManyRecords(usize),
    #[error("the upstream answer is malformed")]
    Malformed,
}

/// A question's name, lower-cased, without the root's dot (`Example.COM.` ->
/// `example.com`); labels with bytes outside letters, digits and `-_` come out escaped,
/// so they never match a rule.
fn name_of(q: &Query) -> String {
    let mut s = q.name().to_lowercase().to_ascii();
    if s.ends_with('.') {
        s.pop();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::A;
    use hickory_proto::rr::{Name, Record};

    fn query(name: &str, qtype: RecordType, edns: bool) -> Message {
        let mut m = Message::new(0x1234, MessageType::Query, OpCode::Query);
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
        if edns {
            m.set_edns(Edns::new());
        }
        m
    }

    fn code_of(bytes: &[u8]) -> ResponseCode {
        Message::from_vec(bytes).unwrap().metadata.response_code
    }

    #[test]
    fn a_query_is_read_down_to_its_question() {
        let q =
            GuestQuery::parse(&query("Pypi.ORG.", RecordType::A, false).to_vec().unwrap()).unwrap();
        assert_eq!(q.question.name, "pypi.org");
        assert_eq!(q.question.qtype, RecordType::A);
        let refused = Message::from_vec(&q.refused()).unwrap();
        assert_eq!(refused.metadata.id, 0x1234);
        assert_eq!(refused.metadata.response_code, ResponseCode::Refused);
        assert_eq!(refused.queries.len(), 1);
    }

    #[test]
    fn only_the_question_goes_upstream() {
        let mut m = query("pypi.org", RecordType::A, true);
        // Data a guest might hide in the query's other sections.
        m.add_additional(Record::from_rdata(
            Name::from_ascii("secret-data.example.").unwrap(),
            60,
            RData::A(A::new(10, 0, 0, 1)),
        ));
        let q = GuestQuery::parse(&m.to_vec().unwrap()).unwrap();
        let up = Message::from_vec(&q.upstream_query(77)).unwrap();
        assert_eq!(up.metadata.id, 77);
        assert!(up.additionals.is_empty() && up.answers.is_empty());
        assert_eq!(up.queries[0].name().to_ascii(), "pypi.org.");
        assert_eq!(up.queries.len(), 1);
        assert_eq!(up.edns.unwrap().max_payload(), UPSTREAM_PAYLOAD);
        let plain =
            GuestQuery::parse(&query("pypi.org", RecordType::A, false).to_vec().unwrap()).unwrap();
        assert!(Message::from_vec(&plain.upstream_query(1))
            .unwrap()
            .edns
            .is_none());
    }

    #[test]
    fn odd_queries_are_refused() {
        let refused = |m: Message| {
            let (e, answer) = GuestQuery::parse(&m.to_vec().unwrap()).unwrap_err();
            (e, answer.map(|a| code_of(&a)))
        };
        for t in [RecordType::ANY, RecordType::AXFR, RecordType::IXFR] {
            let (e, code) = refused(query("pypi.org", t, false));
            assert!(matches!(e, QueryError::Refused(_)), "{t}: {e}");
            assert_eq!(code, Some(ResponseCode::Refused));
        }
        let mut chaos = query("version.bind", RecordType::TXT, false);
        chaos.queries[0].set_query_class(DNSClass::CH);
        assert_eq!(refused(chaos).1, Some(ResponseCode::Refused));
        let mut two = query("a.org", RecordType::A, false);
        two.add_query(Query::query(
            Name::from_ascii("b.org").unwrap(),
            RecordType::A,
        ));
        assert_eq!(refused(two).1, Some(ResponseCode::FormErr));
        let mut update = query("a.org", RecordType::A, false);
        update.metadata.op_code = OpCode::Update;
        assert_eq!(refused(update).1, Some(ResponseCode::NotImp));
        let mut none = query("a.org", RecordType::A, false);
        none.queries.clear();
        assert_eq!(refused(none).1, Some(ResponseCode::FormErr));
    }

    #[test]
    fn hostile_bytes_get_no_forwarding() {
        // Too short, too long, a response, garbage after a header, a label past the end.
        assert_eq!(
            GuestQuery::parse(&[0; 11]).unwrap_err(),
            (QueryError::Unreadable, None)
        );
        let long = vec![0u8; MAX_QUERY_BYTES + 1];
        assert_eq!(
            GuestQuery::parse(&long).unwrap_err().0,
            QueryError::Unreadable
        );
        let mut response = query("a.org", RecordType::A, false);
        response.metadata.message_type = MessageType::Response;
        let e = GuestQuery::parse(&response.to_vec().unwrap()).unwrap_err();
        assert_eq!(e, (QueryError::Unreadable, None));
        let mut junk = query("a.org", RecordType::A, false).to_vec().unwrap();
        junk.truncate(16);
        let (e, answer) = GuestQuery::parse(&junk).unwrap_err();
        assert_eq!(e, QueryError::Malformed);
        assert_eq!(code_of(&answer.unwrap()), ResponseCode::FormErr);
        // A name whose label length points past the message; a compression loop.
        let mut bad = vec![0x12, 0x34, 0x01, 0, 0, 1, 0, 0, 0, 0, 0, 0, 63, b'a'];
        assert_eq!(
            GuestQuery::parse(&bad).unwrap_err().0,
            QueryError::Malformed
        );
        bad.truncate(12);
        bad.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1]);
        assert_eq!(
            GuestQuery::parse(&bad).unwrap_err().0,
            QueryError::Malformed
        );
    }

    fn answer_to(q: &Message, id: u16, records: usize) -> Vec<u8> {
        let mut m = Message::response(id, OpCode::Query);
        m.queries = q.queries.clone();
        for i in 0..records {
            m.add_answer(Record::from_rdata(
                q.queries[0].name().clone(),
                300,
                RData::A(A::new(192, 0, 2, (i % 250) as u8)),
            ));
        }
        m.to_vec().unwrap()
    }

    #[test]
    fn answers_must_match_the_question_and_stay_bounded() {
        let m = query("pypi.org", RecordType::A, false);
        let q = GuestQuery::parse(&m.to_vec().unwrap()).unwrap();
        // Ours: the guest's id back, the addresses read.
        let a = q
            .check_answer(99, &answer_to(&m, 99, 2), true)
            .unwrap()
            .unwrap();
        let back = Message::from_vec(&a.bytes).unwrap();
        assert_eq!(back.metadata.id, 0x1234);
        assert_eq!(
            a.addresses,
            [([192, 0, 2, 0].into(), 300), ([192, 0, 2, 1].into(), 300)]
        );
        // Another id, another question, a query: not the answer.
        assert!(q
            .check_answer(98, &answer_to(&m, 99, 1), true)
            .unwrap()
            .is_none());
        let other = query("evil.org", RecordType::A, false);
        assert!(q
            .check_answer(99, &answer_to(&other, 99, 1), true)
            .unwrap()
            .is_none());
        assert!(q
            .check_answer(99, &m.to_vec().unwrap(), true)
            .unwrap()
            .is_none());
        // Too many records; too many bytes; garbage under our id.
        let e = q.check_answer(99, &answer_to(&m, 99, MAX_ANSWER_RECORDS + 1), false);
        assert_eq!(
            e.unwrap_err(),
            AnswerError::TooManyRecords(MAX_ANSWER_RECORDS + 1)
        );
        let e = q.check_answer(99, &vec![0; MAX_ANSWER_BYTES + 1], false);
        assert!(matches!(e, Err(AnswerError::TooLong(_))));
        let e = q.check_answer(99, &[0, 99, 0x81, 0x80, 0, 1], false);
        assert_eq!(e.unwrap_err(), AnswerError::Malformed);
        // Over UDP without EDNS: at most 512 bytes, else truncated.
        let big = q
            .check_answer(99, &answer_to(&m, 99, 60), true)
            .unwrap()
            .unwrap();
        let t = Message::from_vec(&big.bytes).unwrap();
        assert!(big.bytes.len() <= PLAIN_UDP_PAYLOAD && t.metadata.truncation);
        assert!(t.answers.is_empty());
        let tcp = q
            .check_answer(99, &answer_to(&m, 99, 60), false)
            .unwrap()
            .unwrap();
        assert_eq!(Message::from_vec(&tcp.bytes).unwrap().answers.len(), 60);
    }
}
