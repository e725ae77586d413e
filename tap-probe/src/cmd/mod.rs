//! One module per subcommand: its arguments and its `run`.

pub(crate) mod bench;
pub(crate) mod check;
pub(crate) mod demo;
pub(crate) mod doctor;
pub(crate) mod load;
pub(crate) mod record;
pub(crate) mod replay;
pub(crate) mod serve;
pub(crate) mod vm;
pub(crate) mod watch;
