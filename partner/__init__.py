"""The partner's SFTP destination: listing, upload, rename, evidence and the delivery classifier."""
