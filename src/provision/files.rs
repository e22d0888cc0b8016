//! Reading secret files: a key, seed or private key that group or others may read is refused,
//! never used. (Writing goes through [`crate::files`], which creates them owner-only.)

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use super::ProvisionError;
use crate::files::FileError;

/// Reads a secret file, refusing it when group or others may read or write it.
pub(crate) fn read_private(path: &Path) -> Result<String, ProvisionError> {
    let meta = fs::metadata(path).map_err(FileError::at(path, "reading metadata of"))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(ProvisionError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    Ok(fs::read_to_string(path).map_err(FileError::at(path, "reading"))?)
}
