/** The user's account: confirmation, resend, authcode (to be built). */
export function Account() {
  return (
    <main>
      <h1>Account</h1>
    </main>
  );
}
