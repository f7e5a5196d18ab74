use std::fmt;
use std::os::raw::{c_char, c_int};

/// An error from the engine (the message of its error buffer) or from the host side.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    msg: String,
}

impl Error {
    pub fn new(msg: impl Into<String>) -> Error {
        Error { msg: msg.into() }
    }
    pub fn message(&self) -> &str {
        &self.msg
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

const ERR_LEN: usize = 1024;

/// Runs one fallible bridge call with an error buffer: `f(err, errlen)` returns the call's
/// status; nonzero becomes `Err` with the buffer's message.
pub(crate) fn check(what: &str, f: impl FnOnce(*mut c_char, usize) -> c_int) -> Result<()> {
    let mut buf = [0 as c_char; ERR_LEN];
    if f(buf.as_mut_ptr(), ERR_LEN) == 0 {
        return Ok(());
    }
    buf[ERR_LEN - 1] = 0;
    let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    let msg = String::from_utf8_lossy(&bytes);
    Err(Error::new(if msg.is_empty() {
        format!("{}: failed without a message", what)
    } else {
        format!("{}: {}", what, msg)
    }))
}

/// A NUL-terminated fixed-size C string field as a Rust string.
pub(crate) fn field_str(f: &[c_char]) -> String {
    let bytes: Vec<u8> = f.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
