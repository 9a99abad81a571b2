pub mod debug;
pub mod expr;
